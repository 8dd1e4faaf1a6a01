// storage/run_dir.hpp: the run directory of DESIGN §3 (runs/NAME/), its paths and its lock.
#pragma once

#include <filesystem>
#include <string>

#include "core/error.hpp"

namespace crucible::storage {

/// A run directory held by this process. Creating or opening one takes an exclusive
/// flock(2) on `run.lock` (holding the owner's pid), so two processes never drive the same
/// run; the lock goes with the process, even on kill -9. Movable, not copyable.
class run_directory final {
public:
  /// Creates `root/name/` with `checkpoints/`. errc::busy if another process holds it;
  /// errc::invalid_arg if it already holds a run (a `config.yaml`) and `allow_existing` is false.
  static result<run_directory> create(const std::filesystem::path& root, const std::string& name,
                                      bool allow_existing = false);
  /// Opens an existing run directory (one with `config.yaml`) and takes its lock.
  static result<run_directory> open(const std::filesystem::path& dir);

  run_directory(run_directory&& other) noexcept;
  run_directory& operator=(run_directory&& other) noexcept;
  run_directory(const run_directory&) = delete;
  run_directory& operator=(const run_directory&) = delete;
  ~run_directory();

  const std::filesystem::path& path() const noexcept { return dir_; }
  std::filesystem::path config_file() const { return dir_ / "config.yaml"; }
  std::filesystem::path metrics_file() const { return dir_ / "metrics.jsonl"; }
  std::filesystem::path replay_db() const { return dir_ / "replay.db"; }
  std::filesystem::path checkpoints_dir() const { return dir_ / "checkpoints"; }
  std::filesystem::path events_log() const { return dir_ / "events.log"; }
  std::filesystem::path status_file() const { return dir_ / "status.json"; }

private:
  run_directory(std::filesystem::path dir, int lock_fd) : dir_(std::move(dir)), lock_fd_(lock_fd) {}
  std::filesystem::path dir_;
  int lock_fd_ = -1;
};

/// True if a live process holds the lock of the run directory `dir` (used by `status` to
/// tell a running run from one that crashed). Takes and releases no lock itself for long.
bool run_directory_locked(const std::filesystem::path& dir);

} // namespace crucible::storage
