// env/eval/evaluation_context.hpp: what one evaluation (env/eval/evaluation.hpp) may use of its
// evaluator's: the options, the device gate, the worker pool, the build service, the reference's
// timings alone, the time counters and the host cache flush. The evaluator owns them all and
// hands an evaluation this context instead of itself. Internal to env/.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/log.hpp"
#include "env/eval/device_kind.hpp"

namespace crucible::env {

class build_service;
class device_gate;
class worker_pool;

/// The reference's samples timed alone in a process that never saw a candidate
/// (boundary::check_clean_reference), by task, protocol and calls a sample. Thread-safe.
class reference_baselines final {
public:
  std::optional<std::vector<double>> find(const std::string& key) const {
    std::lock_guard guard{mtx_};
    if (auto it = ms_.find(key); it != ms_.end())
      return it->second;
    return std::nullopt;
  }
  void keep(const std::string& key, std::vector<double> ms) {
    std::lock_guard guard{mtx_};
    ms_[key] = std::move(ms);
  }

private:
  mutable std::mutex mtx_;
  std::map<std::string, std::vector<double>> ms_;
};

/// Evicts the last-level cache by reading `bytes` of this process's own memory (flush_bytes_of):
/// before each timed sample across the trust boundary on the CPU. Used under the timed gate only
/// (one evaluation at a time), so it takes no lock.
class host_cache_flush final {
public:
  explicit host_cache_flush(std::uint64_t bytes) : bytes_(flush_bytes_of(bytes, kind_of("cpu"))) {}
  void run() {
    if (buf_.empty())
      buf_.assign(std::max<std::uint64_t>(bytes_, 8) / 8, 1);
    std::uint64_t sum = 0;
    for (const auto x : buf_)
      sum += x;
    volatile std::uint64_t sink = sum; // the reads are used
    (void) sink;
  }

private:
  std::uint64_t bytes_;
  std::vector<std::uint64_t> buf_;
};

/// Time all evaluations of one evaluator add to (for throughput figures).
struct evaluation_counters {
  std::atomic<std::uint64_t> timing_ns{0};      // inside timed rounds
  std::atomic<std::uint64_t> timed_calls_ns{0}; // inside the timed calls themselves
};

/// What an evaluation may use of its evaluator's. References: the evaluator outlives every
/// evaluation it runs.
struct evaluation_context {
  const evaluator_options& opt;
  const std::string& device;
  logger& log;
  device_gate& gate;
  worker_pool& pool;
  build_service& builds;
  reference_baselines& baselines;
  evaluation_counters& counters;
  host_cache_flush& flush;
  /// Called as an evaluation enters a phase, with the worker's pid (may be empty).
  const std::function<void(const char* phase, pid_t worker)>& observer;
  int outputs_device;      // >= 0: outputs stay on this CUDA device of this process
  std::string protocol_key; // everything that can change a verdict of the same code
  bool ask_peaks = false;   // the reference's worker measures the hardware's peaks (evaluator.limits)
};

} // namespace crucible::env
