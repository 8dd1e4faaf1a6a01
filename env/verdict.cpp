#include "env/verdict.hpp"

#include <algorithm>

#include <yaml-cpp/yaml.h>

#include "core/json.hpp"

namespace crucible::env {

const char* to_string(verdict_status s) noexcept {
  switch (s) {
    case verdict_status::ok: return "ok";
    case verdict_status::incorrect: return "incorrect";
    case verdict_status::compile_error: return "compile_error";
    case verdict_status::runtime_error: return "runtime_error";
    case verdict_status::timeout: return "timeout";
    case verdict_status::rejected: return "rejected";
    case verdict_status::format_error: return "format_error";
  }
  return "?";
}

std::optional<verdict_status> parse_verdict_status(std::string_view s) noexcept {
  for (std::uint8_t i = 0; is_valid(static_cast<verdict_status>(i)); ++i)
    if (s == to_string(static_cast<verdict_status>(i)))
      return static_cast<verdict_status>(i);
  return std::nullopt;
}

namespace {

bool same_number(double x, double y) noexcept {
  return (std::isnan(x) && std::isnan(y)) || x == y;
}

} // namespace

bool operator==(const verdict& x, const verdict& y) noexcept {
  return x.status == y.status && x.correct == y.correct && same_number(x.speedup, y.speedup)
         && same_number(x.speedup_spread, y.speedup_spread) && same_number(x.ref_ms, y.ref_ms)
         && same_number(x.cand_ms, y.cand_ms) && same_number(x.reward, y.reward)
         && x.checks_failed == y.checks_failed && x.message == y.message && x.hardware == y.hardware
         && x.cache_hit == y.cache_hit && x.rounds == y.rounds && same_number(x.wall_s, y.wall_s)
         && x.baseline == y.baseline && x.profile.size() == y.profile.size()
         && std::equal(x.profile.begin(), x.profile.end(), y.profile.begin(),
                       [](const kernel_share& a, const kernel_share& b) { return a.name == b.name && same_number(a.share, b.share); })
         && same_number(x.own_share, y.own_share) && x.precision_reference == y.precision_reference
         && x.precision_candidate == y.precision_candidate;
}

std::vector<std::string> verdict::precision_changes() const {
  std::vector<std::string> out;
  for (const auto& [name, value] : precision_candidate) {
    auto it = precision_reference.find(name);
    const std::string ref = it == precision_reference.end() ? std::string{"not reported"} : it->second;
    if (ref != value)
      out.push_back(name + ": " + value + " (reference " + ref + ")");
  }
  return out;
}

std::string to_json(const verdict& v) {
  json_writer w;
  w.begin_object()
    .field("status", to_string(v.status))
    .field("correct", v.correct)
    .field("speedup", v.speedup)
    .field("speedup_spread", v.speedup_spread)
    .field("ref_ms", v.ref_ms)
    .field("cand_ms", v.cand_ms)
    .field("reward", v.reward)
    .field("checks_failed", v.checks_failed)
    .field("message", v.message)
    .field("hardware", v.hardware)
    .field("cache_hit", v.cache_hit)
    .field("rounds", static_cast<std::uint64_t>(v.rounds))
    .field("wall_s", v.wall_s)
    .field("baseline", v.baseline);
  if (!v.profile.empty()) {
    w.key("profile").begin_array();
    for (const auto& k : v.profile)
      w.begin_object().field("name", k.name).field("share", k.share).end_object();
    w.end_array();
  }
  if (!std::isnan(v.own_share))
    w.field("own_share", v.own_share);
  if (!v.precision_reference.empty() || !v.precision_candidate.empty()) {
    w.key("precision").begin_object();
    for (const auto& [side, m] : {std::pair{"reference", &v.precision_reference}, std::pair{"candidate", &v.precision_candidate}}) {
      w.key(side).begin_object();
      for (const auto& [name, value] : *m)
        w.field(name, value);
      w.end_object();
    }
    w.end_object();
  }
  w.end_object();
  return std::move(w).take();
}

std::optional<verdict> verdict_from_json(std::string_view json) {
  try {
    auto n = YAML::Load(std::string{json});
    if (!n.IsMap())
      return std::nullopt;
    auto num = [&](const char* key) {
      auto x = n[key];
      return !x.IsDefined() || x.IsNull() ? NAN : x.as<double>();
    };
    verdict v;
    auto status = parse_verdict_status(n["status"].as<std::string>());
    if (!status)
      return std::nullopt;
    v.status = *status;
    v.correct = n["correct"].as<bool>();
    v.speedup = num("speedup");
    v.speedup_spread = num("speedup_spread");
    v.ref_ms = num("ref_ms");
    v.cand_ms = num("cand_ms");
    v.reward = n["reward"].as<double>();
    for (const auto& c : n["checks_failed"])
      v.checks_failed.push_back(c.as<std::string>());
    v.message = n["message"].as<std::string>();
    v.hardware = n["hardware"].as<std::string>();
    v.cache_hit = n["cache_hit"].as<bool>();
    v.rounds = n["rounds"].as<std::uint32_t>();
    v.wall_s = num("wall_s");
    v.baseline = n["baseline"].as<std::string>();
    // Absent in verdicts cached before they carried a profile.
    if (n["profile"].IsSequence())
      for (const auto& k : n["profile"])
        v.profile.push_back({k["name"].as<std::string>(), k["share"].as<double>()});
    v.own_share = num("own_share");
    // Absent in verdicts cached before they carried the sides' numeric settings.
    if (const auto p = n["precision"]; p.IsMap())
      for (const auto& [side, into] : {std::pair{"reference", &v.precision_reference}, std::pair{"candidate", &v.precision_candidate}})
        if (const auto m = p[side]; m.IsMap())
          for (auto it = m.begin(); it != m.end(); ++it)
            (*into)[it->first.as<std::string>()] = it->second.as<std::string>();
    return v;
  } catch (const YAML::Exception&) {
    return std::nullopt;
  }
}

} // namespace crucible::env
