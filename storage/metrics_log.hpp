// storage/metrics_log.hpp: metrics.jsonl, one JSON object per line, appended by the coordinator
// and read by `status`, `report` and `watch`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace crucible::storage {

/// Append-only JSON-lines file. Each record is written with one write(2) on an O_APPEND
/// descriptor. A crash can leave at most the last line torn; open() cuts such a tail off so
/// the next record starts on its own line, and read_metrics() never returns it.
/// Owns its file descriptor; movable, not copyable; not thread-safe (one owner, the coordinator).
class metrics_log final {
public:
  /// Opens or creates `path`, repairing a torn last line.
  static result<metrics_log> open(const std::filesystem::path& path);

  metrics_log(metrics_log&& other) noexcept;
  metrics_log& operator=(metrics_log&& other) noexcept;
  metrics_log(const metrics_log&) = delete;
  metrics_log& operator=(const metrics_log&) = delete;
  ~metrics_log();

  /// Appends one record. `json_object` must be one JSON object without newlines (asserted).
  result<void> append(std::string_view json_object);
  /// fsyncs the file (the coordinator calls it at checkpoints and on shutdown).
  result<void> sync();
  /// Bytes of a torn last line that open() removed (0 for a clean file).
  std::uint64_t repaired_bytes() const noexcept { return repaired_bytes_; }
  /// The file's size now (every record appended so far).
  result<std::uint64_t> size() const;

private:
  metrics_log(int fd, std::uint64_t repaired) : fd_(fd), repaired_bytes_(repaired) {}
  int fd_ = -1;
  std::uint64_t repaired_bytes_ = 0;
  std::filesystem::path path_;  ///< only to name the file in error messages
};

/// Moves the records of `path` after its first `keep` bytes into `aside` (written whole and
/// synced first) and truncates `path` to `keep` bytes; returns the bytes moved (0, with nothing
/// written, where the file is no longer than `keep`). errc::invalid_arg where byte `keep` does
/// not start a line. A resumed run uses it to set aside what a crashed process recorded after
/// its last checkpoint (steps the resumed run does again).
result<std::uint64_t> cut_metrics(const std::filesystem::path& path, std::uint64_t keep,
                                  const std::filesystem::path& aside);

/// The complete lines of a metrics file, in order; a torn last line is skipped.
result<std::vector<std::string>> read_metrics(const std::filesystem::path& path);

} // namespace crucible::storage
