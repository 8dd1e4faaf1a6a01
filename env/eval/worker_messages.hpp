// env/eval/worker_messages.hpp: every message the evaluator sends a worker (docs/evaluator-protocol.md),
// written in one place with nlohmann/json (env/eval/wire.hpp reads the replies as core/json_parse's tree).
// The values are the C++ side's: the worker takes each field the message must carry from it and
// keeps no default of its own. Internal to env/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "env/eval/compare.hpp"

namespace crucible::env::worker_msg {

/// A command with no field but its type: "run", "taken", "copied", "prime", "go", "null",
/// "clock", "finish", "stop", "init", "context".
std::string command(std::string_view type);

/// Across the boundary: input buffers for a sample of `calls` calls.
std::string buffers(std::int64_t calls);
/// Across the boundary (the reference's worker): fresh inputs for `calls` calls from
/// distribution `dist`; with `seed`, one call's from that seed (a trial's inputs again).
std::string draw(std::int64_t calls, int dist, bool on_device = false, std::optional<std::uint64_t> seed = std::nullopt);
/// Across the boundary on a CUDA device: a sample queued behind the go word's reaching `seq`
/// (with `null`: one tiny kernel for the calls).
std::string launch(std::uint32_t seq, bool null);

/// The build service's replies to a worker's `build`: the cache directory, or the build's log.
std::string built(const std::string& dir);
std::string build_failed(const std::string& log);

/// To a zygote: fork a worker bound to `endpoint`, in `scratch`, with `env` as its environment.
std::string fork(const std::string& endpoint, const std::string& scratch, const std::vector<std::string>& env);
/// To a zygote: reap its child `pid`.
std::string reap(long long pid);

/// The job a worker takes (evaluation::job_json gathers the fields).
// One member per field of the `job` message (docs/evaluator-protocol.md): its size is the
// protocol's, and the C++ side owns every default (the worker keeps none: channel.py `_need`).
struct job_fields {
  std::string task_name;
  std::optional<std::string> task_source; // none for the candidate's side of the boundary
  std::string candidate_source;
  std::uint64_t seed = 0;
  std::int64_t trials = 0;
  bool reference_only = false;
  std::string baseline;
  std::uint64_t placement_jitter_bytes = 0;
  bool quiet_gc = false;
  bool eval_mode = false;
  bool static_checks = true;
  std::optional<tolerances> tol;          // with rounding_factor; none for the candidate's side
  double rounding_factor = 0;
  bool outputs_on_device = false;
  bool peaks = false;                     // measure the hardware's peaks (reference.py, measure_peaks)
  std::optional<std::string> role;        // "reference" or "candidate" across the boundary
};
std::string job(const job_fields& f);

} // namespace crucible::env::worker_msg
