// env/build_service.hpp: the evaluator's build service. A worker's `build` request (the
// load_inline or load call its candidate's module made, or a Triton kernel's compile, as JSON) is
// built in a sandboxed builder process of its own; the result is kept in the extension cache under
// the hash of the whole request, the interpreter and the device model. Only this process writes
// the cache; concurrent requests of one key build once. Internal to env/.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>

namespace crucible::env {

class worker_pool;

class build_service final {
public:
  /// Builders come from `pool` (started like workers, retired through it); `python` is the
  /// workers' interpreter (part of every key).
  build_service(worker_pool& pool, std::string python, std::filesystem::path extensions_dir);
  build_service(const build_service&) = delete;
  build_service& operator=(const build_service&) = delete;

  /// The reply for the worker: `built` with the cache directory, or `build_failed` with the log.
  std::string build(const std::string& request, std::chrono::steady_clock::time_point deadline);
  /// Builds made so far (not answered from the cache).
  std::uint64_t builds() const noexcept { return builds_; }

private:
  worker_pool& pool_;
  std::string python_;
  std::filesystem::path extensions_dir_;
  std::mutex mtx_;                    // guards building_
  std::condition_variable cv_;        // a build ended
  std::set<std::string> building_;    // cache keys being built now
  std::atomic<std::uint64_t> builds_{0};
};

} // namespace crucible::env
