// core/config_values.hpp (internal to core/config*.cpp): what a configuration value may be. Each
// type's parsing and rendering (value_traits, the enums' names) and the constraints beyond a type
// that keys declare (core/config_keys.hpp); the decoder, encoder and documenter of core/config.cpp
// use both.
#pragma once

#include <yaml-cpp/yaml.h>

#include "core/device.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/device.hpp"
#include "core/config.hpp"
#include "core/host_port.hpp"

namespace crucible::config_detail {

// -- value types ----------------------------------------------------------------------------

// A constraint beyond the type: `expected` replaces the type's own wording in messages.
template <class T>
struct constraint {
  const char* expected = nullptr;
  std::function<bool(const T&)> ok;
};

template <class T> struct value_traits;

template <> struct value_traits<std::string> {
  static constexpr const char* expected = "a string";
  static constexpr const char* type_name = "string";
  static bool parse(const std::string& s, std::string& out) { out = s; return true; }
  static std::string render(const std::string& v) { return v; }
};

template <> struct value_traits<bool> {
  static constexpr const char* expected = "true or false";
  static constexpr const char* type_name = "bool";
  static bool parse(const std::string& s, bool& out) {
    if (s == "true" || s == "True") { out = true; return true; }
    if (s == "false" || s == "False") { out = false; return true; }
    return false;
  }
  static std::string render(bool v) { return v ? "true" : "false"; }
};

template <class Int>
bool parse_integer(const std::string& s, Int& out) {
  auto first = s.data();
  auto last = s.data() + s.size();
  if (first != last && *first == '+')
    ++first;
  auto [end, ec] = std::from_chars(first, last, out);
  return ec == std::errc{} && end == last && first != last;
}

template <> struct value_traits<std::int64_t> {
  static constexpr const char* expected = "an integer";
  static constexpr const char* type_name = "integer";
  static bool parse(const std::string& s, std::int64_t& out) { return parse_integer(s, out); }
  static std::string render(std::int64_t v) { return std::to_string(v); }
};

template <> struct value_traits<std::uint64_t> {
  static constexpr const char* expected = "a non-negative integer";
  static constexpr const char* type_name = "integer ≥ 0";
  static bool parse(const std::string& s, std::uint64_t& out) {
    return !s.empty() && s[0] != '-' && parse_integer(s, out);
  }
  static std::string render(std::uint64_t v) { return std::to_string(v); }
};

template <> struct value_traits<double> {
  static constexpr const char* expected = "a number";
  static constexpr const char* type_name = "number";
  static bool parse(const std::string& s, double& out) {
    auto first = s.data();
    auto last = s.data() + s.size();
    if (first != last && *first == '+')
      ++first;
    auto [end, ec] = std::from_chars(first, last, out, std::chars_format::general);
    return ec == std::errc{} && end == last && first != last && std::isfinite(out);
  }
  static std::string render(double v) {
    char buf[32];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    std::string out(buf, end);
    if (out.find_first_of(".e") == std::string::npos)
      out += ".0";
    return out;
  }
};

template <> struct value_traits<log_level> {
  static constexpr const char* expected = "one of trace, debug, info, warn, error, off";
  static constexpr const char* type_name = "`trace`, `debug`, `info`, `warn`, `error` or `off`";
  static bool parse(const std::string& s, log_level& out) {
    auto lvl = parse_log_level(s);
    if (lvl)
      out = *lvl;
    return lvl.has_value();
  }
  static std::string render(log_level v) { return to_string(v); }
};

template <class Enum, size_t N>
struct enum_traits {
  static bool parse_from(const std::pair<Enum, const char*> (&names)[N], const std::string& s, Enum& out) {
    for (const auto& [v, n] : names)
      if (s == n) {
        out = v;
        return true;
      }
    return false;
  }
  static std::string render_from(const std::pair<Enum, const char*> (&names)[N], Enum v) {
    for (const auto& [e, n] : names)
      if (e == v)
        return n;
    return "?";
  }
};

inline constexpr std::pair<reward_shape, const char*> reward_shape_names[] = {
  {reward_shape::speedup, "speedup"}, {reward_shape::log_speedup, "log_speedup"}, {reward_shape::clipped, "clipped"}};

template <> struct value_traits<reward_shape> {
  static constexpr const char* expected = "one of speedup, log_speedup, clipped";
  static constexpr const char* type_name = "`speedup`, `log_speedup` or `clipped`";
  static bool parse(const std::string& s, reward_shape& out) {
    return enum_traits<reward_shape, 3>::parse_from(reward_shape_names, s, out);
  }
  static std::string render(reward_shape v) { return enum_traits<reward_shape, 3>::render_from(reward_shape_names, v); }
};

inline constexpr std::pair<timing_baseline, const char*> baseline_names[] = {
  {timing_baseline::eager, "eager"}, {timing_baseline::compile, "compile"},
  {timing_baseline::compile_reduce_overhead, "compile-reduce-overhead"}, {timing_baseline::cuda_graph, "cuda-graph"}};

inline constexpr std::pair<device_init_hold, const char*> init_hold_names[] = {
  {device_init_hold::context, "context"}, {device_init_hold::all, "all"}, {device_init_hold::none, "none"}};

template <> struct value_traits<device_init_hold> {
  static constexpr const char* expected = "one of context, all, none";
  static constexpr const char* type_name = "`context`, `all` or `none`";
  static bool parse(const std::string& s, device_init_hold& out) { return enum_traits<device_init_hold, 3>::parse_from(init_hold_names, s, out); }
  static std::string render(device_init_hold v) { return enum_traits<device_init_hold, 3>::render_from(init_hold_names, v); }
};

inline constexpr std::pair<worker_refill, const char*> refill_names[] = {
  {worker_refill::at_once, "at-once"}, {worker_refill::when_idle, "when-idle"}};

template <> struct value_traits<worker_refill> {
  static constexpr const char* expected = "one of at-once, when-idle";
  static constexpr const char* type_name = "`at-once` or `when-idle`";
  static bool parse(const std::string& s, worker_refill& out) { return enum_traits<worker_refill, 2>::parse_from(refill_names, s, out); }
  static std::string render(worker_refill v) { return enum_traits<worker_refill, 2>::render_from(refill_names, v); }
};

inline constexpr std::pair<cuda_mps_mode, const char*> cuda_mps_names[] = {
  {cuda_mps_mode::auto_, "auto"}, {cuda_mps_mode::on, "on"}, {cuda_mps_mode::off, "off"}};
template <> struct value_traits<cuda_mps_mode> {
  static constexpr const char* expected = "one of auto, on, off";
  static constexpr const char* type_name = "`auto`, `on` or `off`";
  static bool parse(const std::string& s, cuda_mps_mode& out) { return enum_traits<cuda_mps_mode, 3>::parse_from(cuda_mps_names, s, out); }
  static std::string render(cuda_mps_mode v) { return enum_traits<cuda_mps_mode, 3>::render_from(cuda_mps_names, v); }
};

inline constexpr std::pair<isolation_mode, const char*> isolation_names[] = {
  {isolation_mode::strict, "strict"}, {isolation_mode::best_effort, "best-effort"}};

template <> struct value_traits<isolation_mode> {
  static constexpr const char* expected = "one of strict, best-effort";
  static constexpr const char* type_name = "`strict` or `best-effort`";
  static bool parse(const std::string& s, isolation_mode& out) { return enum_traits<isolation_mode, 2>::parse_from(isolation_names, s, out); }
  static std::string render(isolation_mode v) { return enum_traits<isolation_mode, 2>::render_from(isolation_names, v); }
};

template <> struct value_traits<timing_baseline> {
  static constexpr const char* expected = "one of eager, compile, compile-reduce-overhead, cuda-graph";
  static constexpr const char* type_name = "`eager`, `compile`, `compile-reduce-overhead` or `cuda-graph`";
  static bool parse(const std::string& s, timing_baseline& out) {
    return enum_traits<timing_baseline, 4>::parse_from(baseline_names, s, out);
  }
  static std::string render(timing_baseline v) { return enum_traits<timing_baseline, 4>::render_from(baseline_names, v); }
};

inline constexpr std::pair<exemplar_method, const char*> exemplar_method_names[] = {
  {exemplar_method::contrastive, "contrastive"}, {exemplar_method::random, "random"}, {exemplar_method::island, "island"}};

template <> struct value_traits<exemplar_method> {
  static constexpr const char* expected = "one of contrastive, random, island";
  static constexpr const char* type_name = "`contrastive`, `random` or `island`";
  static bool parse(const std::string& s, exemplar_method& out) {
    return enum_traits<exemplar_method, 3>::parse_from(exemplar_method_names, s, out);
  }
  static std::string render(exemplar_method v) { return enum_traits<exemplar_method, 3>::render_from(exemplar_method_names, v); }
};

inline constexpr std::pair<exemplar_score, const char*> exemplar_score_names[] = {
  {exemplar_score::reward, "reward"}, {exemplar_score::fraction, "fraction"}};

template <> struct value_traits<exemplar_score> {
  static constexpr const char* expected = "one of reward, fraction";
  static constexpr const char* type_name = "`reward` or `fraction`";
  static bool parse(const std::string& s, exemplar_score& out) {
    return enum_traits<exemplar_score, 2>::parse_from(exemplar_score_names, s, out);
  }
  static std::string render(exemplar_score v) { return enum_traits<exemplar_score, 2>::render_from(exemplar_score_names, v); }
};

inline constexpr std::pair<straggler_policy, const char*> straggler_policy_names[] = {
  {straggler_policy::drop, "drop"}, {straggler_policy::fill, "fill"}};

template <> struct value_traits<straggler_policy> {
  static constexpr const char* expected = "one of drop, fill";
  static constexpr const char* type_name = "`drop` or `fill`";
  static bool parse(const std::string& s, straggler_policy& out) {
    return enum_traits<straggler_policy, 2>::parse_from(straggler_policy_names, s, out);
  }
  static std::string render(straggler_policy v) { return enum_traits<straggler_policy, 2>::render_from(straggler_policy_names, v); }
};

inline constexpr std::pair<chat_template_mode, const char*> chat_template_mode_names[] = {
  {chat_template_mode::automatic, "auto"}, {chat_template_mode::none, "none"}};

template <> struct value_traits<chat_template_mode> {
  static constexpr const char* expected = "one of auto, none";
  static constexpr const char* type_name = "`auto` or `none`";
  static bool parse(const std::string& s, chat_template_mode& out) {
    return enum_traits<chat_template_mode, 2>::parse_from(chat_template_mode_names, s, out);
  }
  static std::string render(chat_template_mode v) { return enum_traits<chat_template_mode, 2>::render_from(chat_template_mode_names, v); }
};
inline constexpr std::pair<task_sampling, const char*> task_sampling_names[] = {
  {task_sampling::uniform, "uniform"}, {task_sampling::improvement, "improvement"}};

template <> struct value_traits<task_sampling> {
  static constexpr const char* expected = "one of uniform, improvement";
  static constexpr const char* type_name = "`uniform` or `improvement`";
  static bool parse(const std::string& s, task_sampling& out) {
    return enum_traits<task_sampling, 2>::parse_from(task_sampling_names, s, out);
  }
  static std::string render(task_sampling v) { return enum_traits<task_sampling, 2>::render_from(task_sampling_names, v); }
};

inline constexpr std::pair<in_flight_policy, const char*> in_flight_policy_names[] = {
  {in_flight_policy::finish, "finish"}, {in_flight_policy::drop, "drop"}};

template <> struct value_traits<in_flight_policy> {
  static constexpr const char* expected = "one of finish, drop";
  static constexpr const char* type_name = "`finish` or `drop`";
  static bool parse(const std::string& s, in_flight_policy& out) {
    return enum_traits<in_flight_policy, 2>::parse_from(in_flight_policy_names, s, out);
  }
  static std::string render(in_flight_policy v) { return enum_traits<in_flight_policy, 2>::render_from(in_flight_policy_names, v); }
};

inline constexpr std::pair<run_mode, const char*> run_mode_names[] = {{run_mode::async, "async"}, {run_mode::sync, "sync"}};

template <> struct value_traits<run_mode> {
  static constexpr const char* expected = "one of async, sync";
  static constexpr const char* type_name = "`async` or `sync`";
  static bool parse(const std::string& s, run_mode& out) { return enum_traits<run_mode, 2>::parse_from(run_mode_names, s, out); }
  static std::string render(run_mode v) { return enum_traits<run_mode, 2>::render_from(run_mode_names, v); }
};

// -- learner: the enums of core/learner_options.hpp ------------------------------------------

inline constexpr std::pair<reward_transform, const char*> reward_transform_names[] = {
  {reward_transform::none, "none"}, {reward_transform::normalize_clip, "normalize_clip"}};
inline constexpr std::pair<loss_aggregation, const char*> aggregation_names[] = {
  {loss_aggregation::token_mean, "token_mean"}, {loss_aggregation::sequence_mean, "sequence_mean"},
  {loss_aggregation::constant, "constant"}};
inline constexpr std::pair<kl_estimator, const char*> kl_estimator_names[] = {{kl_estimator::k1, "k1"}, {kl_estimator::k3, "k3"}};
inline constexpr std::pair<old_log_probs_source, const char*> old_log_probs_names[] = {
  {old_log_probs_source::recompute, "recompute"}, {old_log_probs_source::behaviour, "behaviour"},
  {old_log_probs_source::automatic, "auto"}};
inline constexpr std::pair<lr_schedule, const char*> lr_schedule_names[] = {
  {lr_schedule::constant, "constant"}, {lr_schedule::cosine, "cosine"}};
inline constexpr std::pair<turn_return, const char*> turn_return_names[] = {
  {turn_return::discounted, "discounted"}, {turn_return::best, "best"}, {turn_return::immediate, "immediate"}};
inline constexpr std::pair<turn_advantage, const char*> turn_advantage_names[] = {
  {turn_advantage::grpo, "grpo"}, {turn_advantage::trloo, "trloo"}};

#define CRUCIBLE_ENUM_TRAITS(Enum, table, expected_text, type_text)                                            \
  template <> struct value_traits<Enum> {                                                                    \
    static constexpr const char* expected = expected_text;                                                   \
    static constexpr const char* type_name = type_text;                                                      \
    static constexpr std::size_t n = std::size(table);                                                       \
    static bool parse(const std::string& s, Enum& out) { return enum_traits<Enum, n>::parse_from(table, s, out); } \
    static std::string render(Enum v) { return enum_traits<Enum, n>::render_from(table, v); }                \
  };
CRUCIBLE_ENUM_TRAITS(reward_transform, reward_transform_names, "one of none, normalize_clip", "`none` or `normalize_clip`")
CRUCIBLE_ENUM_TRAITS(loss_aggregation, aggregation_names, "one of token_mean, sequence_mean, constant",
                     "`token_mean`, `sequence_mean` or `constant`")
CRUCIBLE_ENUM_TRAITS(kl_estimator, kl_estimator_names, "one of k1, k3", "`k1` or `k3`")
CRUCIBLE_ENUM_TRAITS(old_log_probs_source, old_log_probs_names, "one of recompute, behaviour, auto",
                     "`recompute`, `behaviour` or `auto`")
CRUCIBLE_ENUM_TRAITS(lr_schedule, lr_schedule_names, "one of constant, cosine", "`constant` or `cosine`")
CRUCIBLE_ENUM_TRAITS(turn_return, turn_return_names, "one of discounted, best, immediate",
                     "`discounted`, `best` or `immediate`")
CRUCIBLE_ENUM_TRAITS(turn_advantage, turn_advantage_names, "one of grpo, trloo", "`grpo` or `trloo`")
#undef CRUCIBLE_ENUM_TRAITS

template <class Enum, std::size_t N>
const char* name_in(const std::pair<Enum, const char*> (&names)[N], Enum v) noexcept {
  for (const auto& [e, n] : names)
    if (e == v)
      return n;
  return "?";
}

template <> struct value_traits<std::vector<std::string>> {
  static constexpr const char* expected = "a list of strings";
  static constexpr const char* type_name = "list of strings";
  static std::string render(const std::vector<std::string>& v) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i)
      out += (i ? ", " : "") + v[i];
    return out + "]";
  }
};

// Decodes one node into a value of T; false when the node has the wrong shape or text.
template <class T>
bool parse_node(const YAML::Node& n, T& out) {
  return n.IsScalar() && value_traits<T>::parse(n.Scalar(), out);
}

template <>
inline bool parse_node(const YAML::Node& n, std::vector<std::string>& out) {
  if (!n.IsSequence())
    return false;
  out.clear();
  for (const auto& item : n) {
    if (!item.IsScalar())
      return false;
    out.push_back(item.Scalar());
  }
  return true;
}

inline bool looks_numeric(const std::string& s) {
  double d;
  return value_traits<double>::parse(s, d);
}

// How a rejected node is shown after "got".
inline std::string describe_node(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull())
    return "nothing";
  if (n.IsMap())
    return "a map";
  if (n.IsSequence())
    return "a list";
  const auto& s = n.Scalar();
  if (looks_numeric(s) || s == "true" || s == "false")
    return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

// -- the declaration of every key -----------------------------------------------------------

inline constraint<std::string> run_name() {
  return {"a name of letters, digits, '.', '-' and '_'", [](const std::string& s) {
            return !s.empty() && s != "." && s != ".."
                   && std::all_of(s.begin(), s.end(), [](char c) {
                        return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-'
                               || c == '_';
                      });
          }};
}

inline constraint<std::string> non_empty() {
  return {"a non-empty string", [](const std::string& s) { return !s.empty(); }};
}

inline constraint<std::string> zmq_endpoint() {
  return {"empty or a ZeroMQ endpoint tcp://HOST:PORT or ipc://PATH", [](const std::string& s) {
            return s.empty() || (s.rfind("tcp://", 0) == 0 && s.size() > 6)
                   || (s.rfind("ipc://", 0) == 0 && s.size() > 6);
          }};
}

// "HOST:PORT" with a port in [0, 65535], or empty.
inline constraint<std::string> listen_address() {
  return {"empty or HOST:PORT with a port from 0 to 65535",
          [](const std::string& s) { return s.empty() || split_host_port(s).has_value(); }};
}

inline constraint<std::int64_t> at_least(std::int64_t lo, const char* expected) {
  return {expected, [lo](std::int64_t v) { return v >= lo; }};
}

template <class T>
constraint<T> positive(const char* expected) {
  return {expected, [](const T& v) { return v > 0; }};
}

inline constraint<double> non_negative_number() {
  return {"a number ≥ 0", [](double v) { return v >= 0; }};
}

inline constraint<double> between(double lo, double hi, const char* expected) {
  return {expected, [lo, hi](double v) { return v >= lo && v <= hi; }};
}

// "cpu" or "cuda:N" as core/device.hpp reads them (a config names the index: "cuda" alone is not
// taken here).
inline bool is_device_name(const std::string& s) {
  return s != "cuda" && parse_device(s).ok();
}

inline constraint<std::vector<std::string>> device_list() {
  return {"a non-empty list of devices, each \"cpu\" or \"cuda:N\"", [](const std::vector<std::string>& v) {
            return !v.empty() && std::all_of(v.begin(), v.end(), is_device_name);
          }};
}

// learner.devices: each entry a device (empty: model.device); duplicates, a mix of CPU and CUDA and
// the first entry are checked against each other and model.device in core/config.cpp.
inline constraint<std::vector<std::string>> learner_device_list() {
  return {"a list of devices, each \"cpu\" or \"cuda:N\" (empty: model.device)", [](const std::vector<std::string>& v) {
            return std::all_of(v.begin(), v.end(), is_device_name);
          }};
}

inline constraint<double> below_one() {
  return {"a number in [0, 1)", [](double v) { return v >= 0 && v < 1; }};
}

inline constraint<std::string> learner_dtype() {
  return {"one of float32, bfloat16", [](const std::string& s) { return s == "float32" || s == "bfloat16"; }};
}

inline constraint<std::vector<std::string>> lora_target_list() {
  return {"a non-empty list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj",
          [](const std::vector<std::string>& v) {
            static const std::set<std::string> known{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                     "down_proj"};
            return !v.empty() && std::all_of(v.begin(), v.end(), [](const std::string& t) { return known.count(t) != 0; });
          }};
}

} // namespace crucible::config_detail
