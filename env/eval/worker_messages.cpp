// The evaluator's messages to a worker (env/eval/worker_messages.hpp), written with nlohmann/json, the
// library env/eval/wire.hpp reads the workers' messages with.
#include "env/eval/worker_messages.hpp"

#include <nlohmann/json.hpp>

namespace crucible::env::worker_msg {

using nlohmann::json;

namespace {
// A message's text. Strings from outside (a task's or candidate's source, a compiler's log, paths)
// may hold bytes that are not UTF-8: replaced, not refused.
std::string text(const json& m) { return m.dump(-1, ' ', false, json::error_handler_t::replace); }
} // namespace

std::string command(std::string_view type) { return text(json{{"type", type}}); }

std::string buffers(std::int64_t calls) { return text(json{{"type", "buffers"}, {"calls", calls}}); }

std::string draw(std::int64_t calls, int dist, bool on_device, std::optional<std::uint64_t> seed) {
  json m{{"type", "draw"}, {"calls", calls}, {"dist", dist}};
  if (on_device)
    m["on_device"] = true;
  if (seed)
    m["seed"] = *seed;
  return text(m);
}

std::string launch(std::uint32_t seq, bool null) {
  json m{{"type", "launch"}, {"seq", seq}};
  if (null)
    m["null"] = true;
  return text(m);
}

std::string built(const std::string& dir) { return text(json{{"type", "built"}, {"dir", dir}}); }

std::string build_failed(const std::string& log) {
  return text(json{{"type", "build_failed"}, {"log", log}});
}

std::string fork(const std::string& endpoint, const std::string& scratch, const std::vector<std::string>& env) {
  return text(json{{"type", "fork"}, {"endpoint", endpoint}, {"scratch", scratch}, {"env", env}});
}

std::string reap(long long pid) { return text(json{{"type", "reap"}, {"pid", pid}}); }

std::string job(const job_fields& f) {
  json m{{"type", "job"}, {"task_name", f.task_name}};
  if (f.task_source)
    m["task_source"] = *f.task_source;
  m["candidate_source"] = f.candidate_source;
  m["seed"] = f.seed;
  m["trials"] = f.trials;
  m["reference_only"] = f.reference_only;
  m["baseline"] = f.baseline;
  m["placement_jitter_bytes"] = f.placement_jitter_bytes;
  m["quiet_gc"] = f.quiet_gc;
  m["eval_mode"] = f.eval_mode;
  m["static_checks"] = f.static_checks;
  if (f.tol) {
    // {"float32": [atol, rtol], ...}: the reference's worker holds its second call's outputs to them
    // (the reference's determinism check).
    json tol = json::object();
    const std::pair<const char*, tolerance> each[] = {
      {"float64", f.tol->f64}, {"float32", f.tol->f32}, {"float16", f.tol->f16}, {"bfloat16", f.tol->bf16}};
    for (const auto& [name, t] : each)
      tol[name] = json::array({t.atol, t.rtol});
    m["tolerances"] = std::move(tol);
    m["rounding_factor"] = f.rounding_factor;
  }
  m["outputs"] = f.outputs_on_device ? "device" : "host";
  m["peaks"] = f.peaks;
  if (f.role)
    m["role"] = *f.role;
  return text(m);
}

} // namespace crucible::env::worker_msg
