// Decoding, encoding and documenting the configuration from one declaration, describe()
// (core/config_keys.hpp): YAML text and --set overrides in, a checked config out; a config out
// as YAML (the run's config.yaml); the reference in docs/configuration.md.
#include "core/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "core/config_keys.hpp"

namespace crucible {

using namespace config_detail;

const char* to_string(timing_baseline v) noexcept { return name_in(baseline_names, v); }
const char* to_string(device_init_hold v) noexcept { return name_in(init_hold_names, v); }
const char* to_string(worker_refill v) noexcept { return name_in(refill_names, v); }
const char* to_string(isolation_mode v) noexcept { return name_in(isolation_names, v); }
const char* to_string(cuda_mps_mode v) noexcept { return name_in(cuda_mps_names, v); }
const char* to_string(exemplar_method v) noexcept { return name_in(exemplar_method_names, v); }
const char* to_string(straggler_policy v) noexcept { return name_in(straggler_policy_names, v); }
const char* to_string(exemplar_score v) noexcept { return name_in(exemplar_score_names, v); }
const char* to_string(chat_template_mode v) noexcept { return name_in(chat_template_mode_names, v); }
const char* to_string(task_sampling v) noexcept { return name_in(task_sampling_names, v); }
const char* to_string(in_flight_policy v) noexcept { return name_in(in_flight_policy_names, v); }
const char* to_string(run_mode v) noexcept { return name_in(run_mode_names, v); }
const char* to_string(reward_transform v) noexcept { return name_in(reward_transform_names, v); }
const char* to_string(loss_aggregation v) noexcept { return name_in(aggregation_names, v); }
const char* to_string(kl_estimator v) noexcept { return name_in(kl_estimator_names, v); }
const char* to_string(old_log_probs_source v) noexcept { return name_in(old_log_probs_names, v); }
const char* to_string(lr_schedule v) noexcept { return name_in(lr_schedule_names, v); }
const char* to_string(turn_return v) noexcept { return name_in(turn_return_names, v); }
const char* to_string(turn_advantage v) noexcept { return name_in(turn_advantage_names, v); }

namespace {

// -- decoding -------------------------------------------------------------------------------

class decoder {
public:
  decoder(std::string origin, const std::map<std::string, std::string>& overrides,
          std::vector<std::string>& problems)
    : origin_(std::move(origin)), overrides_(overrides), problems_(problems) {}

  void root(const YAML::Node& node, config& c) {
    frames_.push_back(frame{node, "", {}});
    describe(*this, c);
    check_unknown_keys();
    frames_.pop_back();
  }

  template <class F>
  void section(const char* name, const char* doc, F body) {
    auto& top = frames_.back();
    top.declared.insert(name);
    auto path = top.prefix + name;
    YAML::Node child = find(top.node, name);
    if (child.IsDefined() && !child.IsNull() && !child.IsMap()) {
      report(path, child, "expected a map of settings, got " + describe_node(child));
      child = YAML::Node{};
    }
    frames_.push_back(frame{child, path + ".", {}});
    body();
    check_unknown_keys();
    frames_.pop_back();
  }

  template <class T>
  void field(const char* name, T& out, const char* doc, const constraint<T>& c = {}) {
    auto& top = frames_.back();
    top.declared.insert(name);
    auto path = top.prefix + name;
    YAML::Node n = find(top.node, name);
    if (!n.IsDefined())
      return; // absent: keep the default
    const char* expected = c.expected != nullptr ? c.expected : value_traits<T>::expected;
    T value{};
    if (!parse_node(n, value) || (c.ok && !c.ok(value))) {
      report(path, n, std::string{"expected "} + expected + ", got " + describe_node(n));
      return;
    }
    out = std::move(value);
  }

private:
  struct frame {
    YAML::Node node; // a map, or undefined/null when the section is absent
    std::string prefix;
    std::set<std::string> declared;
  };

  static YAML::Node find(const YAML::Node& map, const char* name) {
    if (!map.IsDefined() || !map.IsMap())
      return YAML::Node{YAML::NodeType::Undefined};
    for (auto it = map.begin(); it != map.end(); ++it)
      if (it->first.IsScalar() && it->first.Scalar() == name)
        return it->second;
    return YAML::Node{YAML::NodeType::Undefined};
  }

  void check_unknown_keys() {
    auto& top = frames_.back();
    if (!top.node.IsDefined() || !top.node.IsMap())
      return;
    std::set<std::string> seen;
    for (auto it = top.node.begin(); it != top.node.end(); ++it) {
      auto key = it->first.IsScalar() ? it->first.Scalar() : std::string{"?"};
      auto path = top.prefix + key;
      if (!seen.insert(key).second) {
        report(path, it->first, "duplicate key");
      } else if (top.declared.count(key) == 0) {
        if (const auto* w = withdrawn(path)) {
          if (!keeps(*w, it->second))
            report(path, it->second, std::string{"withdrawn: "} + w->why + "; only `" + w->kept +
                                       "` is accepted, for configurations written before (remove the key)");
        } else {
          report(path, it->first, "unknown key" + suggestion(key, top.declared, top.prefix));
        }
      }
    }
  }

  // Keys that once existed. A value that asks for what is now always so is accepted, so that a
  // run's config.yaml written before the key went still loads (a resumed run); any other value
  // is refused, naming why the key went.
  struct withdrawn_key {
    const char* path;
    const char* kept;
    const char* why;
  };
  static const withdrawn_key* withdrawn(const std::string& path) {
    static constexpr const char* one_path = "every verdict crosses the trust boundary, its reference and its candidate in two workers "
                                            "(the shared path, one worker for both, was removed: docs/evaluator.md, Trust boundary)";
    static constexpr withdrawn_key keys[] = {
      {"evaluator.boundary", "process", one_path},
      {"evaluator.cuda_boundary", "true", one_path},
      {"evaluator.outputs_on_device", "true",
       "CUDA verdicts cross the trust boundary, which keeps every output on the device and compares it there"},
      {"evaluator.timing_reserve", "true",
       "the timing's buffers are the workers' arenas, made to the timed samples' size (docs/evaluator.md, Timing)"},
      {"evaluator.cuda_host_bound", "false",
       "the experiment widened the bands about tenfold and was removed (docs/PERFORMANCE.md, eleventh measurement)"},
    };
    for (const auto& k : keys)
      if (path == k.path)
        return &k;
    return nullptr;
  }
  static bool keeps(const withdrawn_key& k, const YAML::Node& v) {
    if (!v.IsScalar())
      return false;
    if (std::string_view{k.kept} == "true" || std::string_view{k.kept} == "false") {
      bool b = false;
      return YAML::convert<bool>::decode(v, b) && b == (std::string_view{k.kept} == "true");
    }
    return v.Scalar() == k.kept;
  }

  // " (did you mean run.seed?)" for a key within edit distance 2 of a declared one.
  static std::string suggestion(const std::string& key, const std::set<std::string>& declared,
                                const std::string& prefix) {
    std::string best;
    size_t best_d = 3;
    // The closest key; among equally close ones, the one sharing the longest prefix ("sede":
    // seed, not mode).
    auto shared = [&](const std::string& c) {
      std::size_t n = 0;
      while (n < c.size() && n < key.size() && c[n] == key[n])
        ++n;
      return n;
    };
    for (const auto& cand : declared) {
      auto d = edit_distance(key, cand);
      if (d < best_d || (d == best_d && !best.empty() && shared(cand) > shared(best))) {
        best_d = d;
        best = cand;
      }
    }
    if (!best.empty())
      return " (did you mean " + prefix + best + "?)";
    std::string all;
    for (const auto& cand : declared)
      all += (all.empty() ? "" : ", ") + cand;
    return " (expected one of: " + all + ")";
  }

  static size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j)
      prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= b.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
      std::swap(prev, cur);
    }
    return prev[b.size()];
  }

  void report(const std::string& path, const YAML::Node& at, const std::string& what) {
    // An override names itself; a value from the file names its line. Overrides of a parent
    // section (e.g. --set run=3) are found by prefix.
    for (const auto& [opath, text] : overrides_) {
      if (path == opath || path.rfind(opath + ".", 0) == 0) {
        problems_.push_back("--set " + text + ": " + path + ": " + what);
        return;
      }
    }
    auto mark = at.Mark();
    std::string where = origin_;
    if (mark.line >= 0)
      where += ":" + std::to_string(mark.line + 1);
    problems_.push_back(where + ": " + path + ": " + what);
  }

  std::string origin_;
  const std::map<std::string, std::string>& overrides_;
  std::vector<std::string>& problems_;
  std::vector<frame> frames_;
};

// Applies "a.b.c=value" to the tree; the value is parsed as YAML (so `[0, 1]` is a list).
bool apply_override(YAML::Node& root, const std::string& text,
                    std::map<std::string, std::string>& applied, std::vector<std::string>& problems) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    problems.push_back("--set " + text + ": expected key.path=value");
    return false;
  }
  auto path = text.substr(0, eq);
  auto raw = text.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) {
    if (part.empty()) {
      problems.push_back("--set " + text + ": empty component in key path \"" + path + "\"");
      return false;
    }
    parts.push_back(part);
  }
  if (path.back() == '.') {
    problems.push_back("--set " + text + ": empty component in key path \"" + path + "\"");
    return false;
  }
  YAML::Node value;
  try {
    value = YAML::Load(raw);
  } catch (const YAML::Exception& e) {
    problems.push_back("--set " + text + ": value is not valid YAML: " + e.msg);
    return false;
  }
  if (!root.IsDefined() || root.IsNull())
    root = YAML::Node(YAML::NodeType::Map);
  // yaml-cpp nodes are handles: walk with fresh handles (reset), never assign through one.
  YAML::Node cur;
  cur.reset(root);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = cur[parts[i]];
    if (!next.IsDefined() || next.IsNull()) {
      next = YAML::Node(YAML::NodeType::Map);
      cur[parts[i]] = next;
      next.reset(cur[parts[i]]);
    } else if (!next.IsMap()) {
      std::string prefix;
      for (size_t k = 0; k <= i; ++k)
        prefix += (k ? "." : "") + parts[k];
      problems.push_back("--set " + text + ": " + prefix + " is not a map of settings");
      return false;
    }
    cur.reset(next);
  }
  cur[parts.back()] = value;
  applied[path] = text;
  return true;
}

// -- encoding and documentation -------------------------------------------------------------

class encoder {
public:
  explicit encoder(YAML::Emitter& out) : out_(out) {}

  template <class F>
  void section(const char* name, const char* doc, F body) {
    out_ << YAML::Key << name << YAML::Value << YAML::BeginMap;
    body();
    out_ << YAML::EndMap;
  }

  template <class T>
  void field(const char* name, T& value, const char* doc, const constraint<T>& = {}) {
    out_ << YAML::Key << name << YAML::Value;
    if constexpr (std::is_same_v<T, std::string>) {
      out_ << YAML::DoubleQuoted << value;
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      out_ << YAML::Flow << YAML::BeginSeq;
      for (const auto& item : value)
        out_ << YAML::DoubleQuoted << item;
      out_ << YAML::EndSeq;
    } else {
      out_ << value_traits<T>::render(value);
    }
  }

private:
  YAML::Emitter& out_;
};

class documenter {
public:
  explicit documenter(std::string& out) : out_(out) {}

  template <class F>
  void section(const char* name, const char* doc, F body) {
    const std::string outer = prefix_;
    prefix_ = outer + name + ".";
    const std::string title = outer + name;
    out_ += "\n## `" + title + "`\n\n" + doc + "\n";
    need_header_ = true; // the table starts with the section's first key
    body();
    prefix_ = outer;
  }

  template <class T>
  void field(const char* name, T& value, const char* doc, const constraint<T>& c = {}) {
    std::string type = c.expected != nullptr ? c.expected : value_traits<T>::type_name;
    std::string def = value_traits<T>::render(value);
    if constexpr (std::is_same_v<T, std::string>)
      def = "\"" + def + "\"";
    if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      def = "[";
      for (size_t i = 0; i < value.size(); ++i)
        def += (i ? ", " : "") + std::string{"\""} + value[i] + "\"";
      def += "]";
    }
    if (need_header_) {
      out_ += "\n| key | type | default | meaning |\n|---|---|---|---|\n";
      need_header_ = false;
    }
    out_ += "| `" + prefix_ + name + "` | " + type + " | `" + def + "` | " + doc + " |\n";
  }

private:
  std::string& out_;
  std::string prefix_;
  bool need_header_ = false;
};

} // namespace

result<config> parse_config(std::string_view yaml_text, const std::string& origin,
                            const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string{yaml_text});
  } catch (const YAML::ParserException& e) {
    return fail(errc::config, origin, ":", std::to_string(e.mark.line + 1),
                ": not valid YAML: ", e.msg);
  }
  std::vector<std::string> problems;
  if (root.IsDefined() && !root.IsNull() && !root.IsMap())
    return fail(errc::config, origin, ":", std::to_string(root.Mark().line + 1),
                ": expected a map of sections at the top level, got ", describe_node(root));
  std::map<std::string, std::string> applied;
  for (const auto& text : overrides)
    apply_override(root, text, applied, problems);
  config cfg;
  if (problems.empty()) {
    decoder dec{origin, applied, problems};
    dec.root(root, cfg);
  }
  if (problems.empty()) {
    // Relations between keys, named by the later key of each pair.
    auto relation = [&](bool ok, const char* path, const std::string& what) {
      if (!ok)
        problems.push_back(origin + ": " + path + ": " + what);
    };
    const auto& e = cfg.evaluator;
    relation(e.max_rounds >= e.rounds, "evaluator.max_rounds",
             "must be at least evaluator.rounds (" + std::to_string(e.rounds) + ")");
    relation(e.recheck_rounds >= e.buckets, "evaluator.recheck_rounds",
             "must be at least evaluator.buckets (" + std::to_string(e.buckets) + ")");
    relation(e.rounds >= e.buckets, "evaluator.rounds",
             "must be at least evaluator.buckets (" + std::to_string(e.buckets) + ")");
    relation(e.slow_stop_rounds == 0 || e.slow_stop_rounds >= e.buckets, "evaluator.slow_stop_rounds",
             "must be 0 or at least evaluator.buckets (" + std::to_string(e.buckets) + ")");
    relation(cfg.reward.clip_min < cfg.reward.clip_max, "reward.clip_max", "must be greater than reward.clip_min");
    relation(!cfg.log.wandb || cfg.log.tensorboard, "log.wandb",
             "needs log.tensorboard (one writer, tools/metrics_tensorboard.py, makes both)");
    relation(cfg.prompt.max_exemplar_chars == 0 || cfg.prompt.max_exemplar_chars >= cfg.prompt.min_exemplar_chars,
             "prompt.max_exemplar_chars",
             "must be 0 or at least prompt.min_exemplar_chars (" + std::to_string(cfg.prompt.min_exemplar_chars) + ")");
    relation(cfg.membership.timeout_s > cfg.membership.heartbeat_s, "membership.timeout_s",
             "must exceed membership.heartbeat_s (" + value_traits<double>::render(cfg.membership.heartbeat_s) + ")");
    const auto& l = cfg.learner;
    relation(l.schedule != lr_schedule::cosine || l.total_steps > l.warmup_steps, "learner.total_steps",
             "must exceed learner.warmup_steps (" + std::to_string(l.warmup_steps) + ") with the cosine schedule");
    relation(l.kl_coef == 0 || !l.lora || cfg.stages.rl.steps == 0 ||
                 (cfg.stages.sft.steps == 0 && cfg.stages.self_supervised.steps == 0),
             "learner.kl_coef",
             "with learner.lora, RL after an SFT or self-supervised stage cannot take its KL reference from the "
             "policy (the adapters are not merged into it): set it to 0 or run RL alone");
    // A policy behind an endpoint is not trained: only the search stage samples from it.
    const auto& pol = cfg.policy;
    if (pol.backend == "openai") {
      relation(!pol.base_url.empty(), "policy.base_url", "is required with policy.backend openai");
      relation(pol.base_url.empty() || pol.base_url.rfind("http://", 0) == 0 || pol.base_url.rfind("https://", 0) == 0,
               "policy.base_url", "must start with http:// or https://, got '" + pol.base_url + "'");
      relation(!pol.model.empty(), "policy.model", "is required with policy.backend openai (the endpoint's model name)");
      for (auto [steps, path] : {std::pair{cfg.stages.sft.steps, "stages.sft.steps"},
                                 std::pair{cfg.stages.self_supervised.steps, "stages.self_supervised.steps"},
                                 std::pair{cfg.stages.rl.steps, "stages.rl.steps"}})
        relation(steps == 0, path,
                 "must be 0 with policy.backend openai: a model behind an endpoint is not trained here; use "
                 "stages.search (contrastive search without updates)");
    }
    // engine.devices: each of model.device's kind (an engine on the CPU beside a learner on a GPU,
    // or the other way round, would copy every version through the host for nothing), no GPU
    // twice, none beside a rank other than rank 0 (it would take turns with that rank, and the
    // memory plan would count neither beside the other), and a rollout actor for each engine.
    if (!cfg.engine.devices.empty()) {
      const auto& ranks = cfg.learner.devices;
      std::set<std::string> seen;
      for (const auto& d : cfg.engine.devices) {
        relation((d == "cpu") == (cfg.model.device == "cpu"), "engine.devices",
                 d + " is not of model.device's kind (" + cfg.model.device +
                   "): the engines and the learner are all on the CPU or all on GPUs");
        relation(d == "cpu" || seen.insert(d).second, "engine.devices",
                 "names " + d + " twice: one engine per GPU (only `cpu` may repeat, as threads)");
        relation(d == cfg.model.device || std::find(ranks.begin(), ranks.end(), d) == ranks.end(), "engine.devices",
                 d + " is a learner rank's GPU (learner.devices): give each engine a GPU without a rank, or "
                     "model.device (rank 0's)");
      }
      const auto engines = static_cast<std::int64_t>(cfg.engine.devices.size());
      relation(cfg.rollout.actors >= engines, "rollout.actors",
               "is " + std::to_string(cfg.rollout.actors) + ", fewer than the " + std::to_string(engines) +
                 " engines of engine.devices: each engine samples for its own rollout actors (actor i uses engine "
                 "i mod " + std::to_string(engines) + ")");
      relation(cfg.policy.backend != "openai", "engine.devices",
               "must be empty with policy.backend openai: the endpoint generates, no engine runs here");
    }
    // learner.devices against itself and model.device; each rank needs a share of every batch.
    if (!l.devices.empty()) {
      std::set<std::string> seen;
      std::string twice;
      bool cpu = false, cuda = false;
      for (const auto& d : l.devices) {
        (d == "cpu" ? cpu : cuda) = true;
        if (d != "cpu" && !seen.insert(d).second && twice.empty())
          twice = d;
      }
      relation(twice.empty(), "learner.devices",
               "names " + twice + " twice: one learner rank per GPU (only `cpu` may repeat, as threads)");
      relation(!(cpu && cuda), "learner.devices",
               "mixes cpu and cuda devices: the ranks are all threads on the CPU (inproc) or all GPUs (NCCL)");
      relation(l.devices.front() == cfg.model.device, "learner.devices",
               "the first entry (" + l.devices.front() + ") must be model.device (" + cfg.model.device +
                 "): rank 0 trains beside the engine and hands it each version");
      const auto ranks = static_cast<std::int64_t>(l.devices.size());
      const auto at_least_ranks = [&](std::int64_t steps, std::int64_t n, const char* path) {
        relation(steps == 0 || n >= ranks, path,
                 "must be at least the number of learner ranks (" + std::to_string(ranks) +
                   ", learner.devices): each rank trains on its own share of the batch");
      };
      at_least_ranks(cfg.stages.sft.steps, cfg.stages.sft.batch, "stages.sft.batch");
      at_least_ranks(cfg.stages.self_supervised.steps, cfg.stages.self_supervised.groups, "stages.self_supervised.groups");
      at_least_ranks(cfg.stages.rl.steps, cfg.stages.rl.groups, "stages.rl.groups");
    }
  }
  if (!problems.empty()) {
    std::string msg;
    for (const auto& p : problems)
      msg += (msg.empty() ? "" : "\n") + p;
    return error{errc::config, std::move(msg)};
  }
  return cfg;
}

result<config> load_config(const std::filesystem::path& file,
                           const std::vector<std::string>& overrides) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(file, ec))
      return fail(errc::not_found, file.string(), ": no such configuration file");
    return fail(errc::io, file.string(), ": cannot read");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), file.string(), overrides);
}

std::string to_yaml(const config& cfg) {
  config copy = cfg;
  YAML::Emitter out;
  out << YAML::BeginMap;
  encoder enc{out};
  describe(enc, copy);
  out << YAML::EndMap;
  return std::string{out.c_str()} + "\n";
}

std::string config_reference_markdown() {
  std::string out =
    "# Configuration reference\n\n"
    "A run is configured by one YAML file (`crucible train CONFIG`), with any key overridden\n"
    "on the command line by `--set key.path=value`. Unknown keys, wrong types and invalid\n"
    "values are refused with the file, line and key path at fault. The resolved configuration,\n"
    "defaults included, is written to the run directory as `config.yaml`; `crucible config show\n"
    "--file CONFIG` prints it without starting a run.\n\n"
    "This file is generated from the declaration in `core/config_keys.hpp` by `crucible config docs`;\n"
    "a test fails when the two differ.\n";
  config defaults;
  documenter doc{out};
  describe(doc, defaults);
  return out;
}

} // namespace crucible
