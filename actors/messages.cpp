#include "actors/messages.hpp"

#include <cmath>

#include <yaml-cpp/yaml.h>

#include "core/json.hpp"

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

result<run_status> run_status_from_json(std::string_view json) {
  // JSON is a subset of YAML's flow syntax, so yaml-cpp reads what json_writer writes
  // (including \uXXXX escapes); it also accepts some non-JSON, which is harmless here.
  struct missing_key {};
  const char* key = nullptr; // the key being read, for error messages
  try {
    auto root = YAML::Load(std::string{json});
    if (!root.IsMap())
      return fail(errc::corrupt, "run status: expected a JSON object");
    auto get = [&](const char* k) {
      key = k;
      auto node = root[k];
      if (!node.IsDefined())
        throw missing_key{};
      return node;
    };
    auto speedup = [&](const char* k) {
      auto node = get(k);
      return node.IsNull() ? std::numeric_limits<double>::quiet_NaN() : node.as<double>();
    };
    run_status st;
    auto state_text = get("state").as<std::string>();
    auto state = parse_run_state(state_text);
    if (!state)
      return fail(errc::corrupt, "run status: key 'state': unknown state '", state_text, "'");
    st.state = *state;
    st.stage = get("stage").as<std::string>();
    st.step = get("step").as<std::uint64_t>();
    st.policy_version.value = get("policy_version").as<std::uint64_t>();
    st.variants = get("variants").as<std::uint64_t>();
    st.best_speedup = speedup("best_speedup");
    st.mean_speedup = speedup("mean_speedup");
    st.dropped_stale = get("dropped_stale").as<std::uint64_t>();
    key = "discarded"; // written since the counter exists; an older status.json has none
    if (auto d = root["discarded"]; d.IsDefined())
      st.discarded = d.as<std::uint64_t>();
    key = "unfinished"; // likewise
    if (auto u = root["unfinished"]; u.IsDefined())
      st.unfinished = u.as<std::uint64_t>();
    key = "skipped_tasks"; // written only where a run skips tasks (tasks.skip_broken)
    if (auto k = root["skipped_tasks"]; k.IsSequence())
      for (const auto& t : k)
        st.skipped_tasks.push_back(t.as<std::string>());
    key = "devices"; // written only where the run's process uses GPUs
    if (auto k = root["devices"]; k.IsDefined()) {
      if (!k.IsSequence())
        return fail(errc::corrupt, "run status: key 'devices': expected a list");
      for (const auto& d : k) {
        if (!d.IsMap() || !d["device"].IsDefined() || !d["seconds"].IsDefined())
          return fail(errc::corrupt, "run status: key 'devices': each entry needs device and seconds");
        device_busy b;
        b.device = d["device"].as<std::string>();
        b.seconds = d["seconds"].as<double>();
        b.evaluation_s = d["evaluation_s"].IsDefined() ? d["evaluation_s"].as<double>() : 0.0;
        b.policy_s = d["policy_s"].IsDefined() ? d["policy_s"].as<double>() : 0.0;
        b.evaluator = d["evaluator"].IsDefined() && d["evaluator"].as<bool>();
        st.devices.push_back(std::move(b));
      }
    }
    return st;
  } catch (const missing_key&) {
    return fail(errc::corrupt, "run status: key '", key, "' is missing");
  } catch (const YAML::ParserException& e) {
    return fail(errc::corrupt, "run status: malformed JSON: ", e.what());
  } catch (const YAML::Exception&) {
    return fail(errc::corrupt, "run status: key '", key ? key : "?", "': value of the wrong type");
  }
}

} // namespace crucible
