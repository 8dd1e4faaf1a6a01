#include "actors/messages.hpp"

#include <cmath>

#include "core/json.hpp"
#include "core/json_parse.hpp"

namespace crucible {

const char* to_string(run_state x) noexcept {
  switch (x) {
    case run_state::starting: return "starting";
    case run_state::running: return "running";
    case run_state::pausing: return "pausing";
    case run_state::paused: return "paused";
    case run_state::finished: return "finished";
    case run_state::crashed: return "crashed";
  }
  return "invalid";
}

const char* to_string(node_role x) noexcept {
  switch (x) {
    case node_role::evaluator: return "evaluator";
    case node_role::engine: return "engine";
    case node_role::learner: return "learner";
  }
  return "invalid";
}

namespace {

// Linear search over the enumerators through to_string, so a new enumerator only needs a
// to_string case (and an is_valid bound) to become parseable.
template <class Enum, Enum Last>
std::optional<Enum> parse_enum(std::string_view text) noexcept {
  for (auto i = 0u; i <= static_cast<unsigned>(Last); ++i) {
    auto e = static_cast<Enum>(i);
    if (text == to_string(e))
      return e;
  }
  return std::nullopt;
}

bool same_speedup(double x, double y) noexcept {
  return (std::isnan(x) && std::isnan(y)) || x == y;
}

} // namespace

std::optional<run_state> parse_run_state(std::string_view text) noexcept {
  return parse_enum<run_state, run_state::crashed>(text);
}

std::optional<node_role> parse_node_role(std::string_view text) noexcept {
  return parse_enum<node_role, node_role::learner>(text);
}

bool operator==(const run_status& x, const run_status& y) noexcept {
  return x.state == y.state && x.stage == y.stage && x.step == y.step
         && x.policy_version == y.policy_version && x.variants == y.variants
         && same_speedup(x.best_speedup, y.best_speedup)
         && same_speedup(x.mean_speedup, y.mean_speedup) && x.dropped_stale == y.dropped_stale
         && x.discarded == y.discarded && x.unfinished == y.unfinished && x.skipped_tasks == y.skipped_tasks
         && x.devices == y.devices;
}

bool operator==(const stage_report& x, const stage_report& y) noexcept {
  return x.stage == y.stage && x.stage_step == y.stage_step && x.step == y.step && x.done == y.done
         && x.policy_version == y.policy_version && x.variants == y.variants
         && same_speedup(x.best_speedup, y.best_speedup) && same_speedup(x.mean_speedup, y.mean_speedup)
         && x.dropped_stale == y.dropped_stale && x.discarded == y.discarded && x.unfinished == y.unfinished
         && x.skipped_tasks == y.skipped_tasks && x.devices == y.devices && x.records == y.records;
}

void write_fields(json_writer& w, const run_status& x) {
  w.field("state", to_string(x.state))
    .field("stage", x.stage)
    .field("step", x.step)
    .field("policy_version", x.policy_version.value)
    .field("variants", x.variants);
  // json_writer turns NaN into null already; spelled out because null is the contract here.
  w.key("best_speedup");
  std::isnan(x.best_speedup) ? w.null() : w.value(x.best_speedup);
  w.key("mean_speedup");
  std::isnan(x.mean_speedup) ? w.null() : w.value(x.mean_speedup);
  w.field("dropped_stale", x.dropped_stale);
  w.field("discarded", x.discarded);
  w.field("unfinished", x.unfinished);
  if (!x.skipped_tasks.empty()) {
    w.key("skipped_tasks").begin_array();
    for (const auto& t : x.skipped_tasks)
      w.value(t);
    w.end_array();
  }
  if (!x.devices.empty()) {
    w.key("devices").begin_array();
    for (const auto& d : x.devices)
      w.begin_object()
        .field("device", d.device)
        .field("seconds", d.seconds)
        .field("evaluation_s", d.evaluation_s)
        .field("policy_s", d.policy_s)
        .field("evaluator", d.evaluator)
        .field("engine", d.engine)
        .field("learner", d.learner)
        .end_object();
    w.end_array();
  }
}

std::string to_json(const run_status& x) {
  json_writer w;
  w.begin_object();
  write_fields(w, x);
  w.end_object();
  return std::move(w).take();
}

namespace {

// A key of a run status that is missing, or holds a value of the wrong type.
struct bad_status_key {
  const char* key;
  bool missing;
};

std::uint64_t uint_at(const json_value& v, const char* key) {
  if (!v.is_uint())
    throw bad_status_key{key, false};
  return v.as_uint();
}

double double_at(const json_value& v, const char* key) {
  if (!v.is_number())
    throw bad_status_key{key, false};
  return v.as_double();
}

const std::string& string_at(const json_value& v, const char* key) {
  if (!v.is_string())
    throw bad_status_key{key, false};
  return v.as_string();
}

bool bool_at(const json_value& v, const char* key) {
  if (!v.is_bool())
    throw bad_status_key{key, false};
  return v.as_bool();
}

} // namespace

result<run_status> run_status_from_json(std::string_view json) {
  auto doc = parse_json(json);
  if (!doc)
    return fail(errc::corrupt, "run status: malformed JSON: ", doc.error().message);
  const json_value& root = *doc;
  if (!root.is_object())
    return fail(errc::corrupt, "run status: expected a JSON object");
  auto get = [&](const char* k) -> const json_value& {
    const auto* v = root.find(k);
    if (v == nullptr)
      throw bad_status_key{k, true};
    return *v;
  };
  auto speedup = [&](const char* k) {
    const auto& v = get(k);
    return v.is_null() ? std::numeric_limits<double>::quiet_NaN() : double_at(v, k);
  };
  try {
    run_status st;
    const auto& state_text = string_at(get("state"), "state");
    auto state = parse_run_state(state_text);
    if (!state)
      return fail(errc::corrupt, "run status: key 'state': unknown state '", state_text, "'");
    st.state = *state;
    st.stage = string_at(get("stage"), "stage");
    st.step = uint_at(get("step"), "step");
    st.policy_version.value = uint_at(get("policy_version"), "policy_version");
    st.variants = uint_at(get("variants"), "variants");
    st.best_speedup = speedup("best_speedup");
    st.mean_speedup = speedup("mean_speedup");
    st.dropped_stale = uint_at(get("dropped_stale"), "dropped_stale");
    // Written since the counter exists; an older status.json has none.
    if (const auto* d = root.find("discarded"))
      st.discarded = uint_at(*d, "discarded");
    if (const auto* u = root.find("unfinished")) // likewise
      st.unfinished = uint_at(*u, "unfinished");
    // Written only where a run skips tasks (tasks.skip_broken).
    if (const auto* k = root.find("skipped_tasks"); k != nullptr && k->is_array())
      for (const auto& t : k->as_array())
        st.skipped_tasks.push_back(string_at(t, "skipped_tasks"));
    // Written only where the run's process uses GPUs.
    if (const auto* k = root.find("devices")) {
      if (!k->is_array())
        return fail(errc::corrupt, "run status: key 'devices': expected a list");
      for (const auto& d : k->as_array()) {
        if (!d.is_object() || d.find("device") == nullptr || d.find("seconds") == nullptr)
          return fail(errc::corrupt, "run status: key 'devices': each entry needs device and seconds");
        device_busy b;
        b.device = string_at(*d.find("device"), "devices");
        b.seconds = double_at(*d.find("seconds"), "devices");
        const auto* evaluation = d.find("evaluation_s");
        b.evaluation_s = evaluation != nullptr ? double_at(*evaluation, "devices") : 0.0;
        const auto* policy = d.find("policy_s");
        b.policy_s = policy != nullptr ? double_at(*policy, "devices") : 0.0;
        const auto* evaluator = d.find("evaluator");
        b.evaluator = evaluator != nullptr && bool_at(*evaluator, "devices");
        const auto* engine = d.find("engine");
        b.engine = engine != nullptr && bool_at(*engine, "devices");
        const auto* learner = d.find("learner");
        b.learner = learner != nullptr && bool_at(*learner, "devices");
        st.devices.push_back(std::move(b));
      }
    }
    return st;
  } catch (const bad_status_key& e) {
    if (e.missing)
      return fail(errc::corrupt, "run status: key '", e.key, "' is missing");
    return fail(errc::corrupt, "run status: key '", e.key, "': value of the wrong type");
  }
}

} // namespace crucible
