// The evaluator's messages to a worker (env/worker_messages.hpp).
#include "env/worker_messages.hpp"

#include <utility>

#include "core/json.hpp"

namespace crucible::env::worker_msg {

std::string command(std::string_view type) {
  json_writer w;
  w.begin_object().field("type", type).end_object();
  return std::move(w).take();
}

std::string time(std::int64_t rounds, double warmup_ms, std::int64_t warmup_rounds, bool announce) {
  json_writer w;
  w.begin_object()
    .field("type", "time")
    .field("rounds", rounds)
    .field("warmup_ms", warmup_ms)
    .field("warmup_rounds", warmup_rounds)
    .field("announce", announce)
    .end_object();
  return std::move(w).take();
}

std::string buffers(std::int64_t calls) {
  json_writer w;
  w.begin_object().field("type", "buffers").field("calls", calls).end_object();
  return std::move(w).take();
}

std::string draw(std::int64_t calls, int dist) {
  json_writer w;
  w.begin_object().field("type", "draw").field("calls", calls).field("dist", dist).end_object();
  return std::move(w).take();
}

std::string launch(std::uint32_t seq, bool null) {
  json_writer w;
  w.begin_object().field("type", "launch").field("seq", static_cast<std::uint64_t>(seq));
  if (null)
    w.field("null", true);
  w.end_object();
  return std::move(w).take();
}

std::string built(const std::string& dir) {
  json_writer w;
  w.begin_object().field("type", "built").field("dir", dir).end_object();
  return std::move(w).take();
}

std::string build_failed(const std::string& log) {
  json_writer w;
  w.begin_object().field("type", "build_failed").field("log", log).end_object();
  return std::move(w).take();
}

std::string fork(const std::string& endpoint, const std::string& scratch, const std::vector<std::string>& env) {
  json_writer w;
  w.begin_object().field("type", "fork").field("endpoint", endpoint).field("scratch", scratch).field("env", env).end_object();
  return std::move(w).take();
}

std::string reap(long long pid) {
  json_writer w;
  w.begin_object().field("type", "reap").field("pid", static_cast<std::int64_t>(pid)).end_object();
  return std::move(w).take();
}

std::string job(const job_fields& f) {
  json_writer w;
  w.begin_object().field("type", "job").field("task_name", f.task_name);
  if (f.task_source)
    w.field("task_source", *f.task_source);
  w.field("candidate_source", f.candidate_source)
    .field("seed", f.seed)
    .field("trials", f.trials)
    .field("reference_only", f.reference_only)
    .field("baseline", f.baseline)
    .field("flush_bytes", f.flush_bytes)
    .field("placement_jitter_bytes", f.placement_jitter_bytes)
    .field("sample_ms", f.sample_ms)
    .field("max_calls", f.max_calls)
    .field("timing_reserve", f.timing_reserve)
    .field("quiet_gc", f.quiet_gc)
    .field("eval_mode", f.eval_mode)
    .field("static_checks", f.static_checks);
  if (f.tol) {
    // {"float32": [atol, rtol], ...}: the worker holds every timed call's outputs to them.
    w.key("tolerances").begin_object();
    const std::pair<const char*, tolerance> each[] = {
      {"float64", f.tol->f64}, {"float32", f.tol->f32}, {"float16", f.tol->f16}, {"bfloat16", f.tol->bf16}};
    for (const auto& [name, t] : each)
      w.key(name).begin_array().value(t.atol).value(t.rtol).end_array();
    w.end_object();
    w.field("rounding_factor", f.rounding_factor);
  }
  w.field("outputs", f.outputs_on_device ? "device" : "host");
  if (f.role)
    w.field("role", *f.role);
  w.end_object();
  return std::move(w).take();
}

} // namespace crucible::env::worker_msg
