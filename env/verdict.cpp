#include "env/verdict.hpp"

#include <algorithm>
#include <limits>
#include <type_traits>

#include "core/json.hpp"
#include "core/json_parse.hpp"

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

std::optional<task_work> task_work_from_json(const json_value& w) {
  const auto* flops = w.find("flops");
  const auto* read = w.find("bytes_read");
  const auto* written = w.find("bytes_written");
  auto count = [](const json_value* x) { return x != nullptr && x->is_number() && std::isfinite(x->as_double()) && x->as_double() >= 0; };
  if (!w.is_object() || flops == nullptr || !flops->is_object() || !count(read) || !count(written))
    return std::nullopt;
  task_work work;
  for (const auto& m : flops->as_object()) {
    if (!count(&m.value) || m.key.empty() || m.key.size() >= 32)
      return std::nullopt;
    work.flops[m.key] = m.value.as_double();
  }
  work.bytes_read = read->as_double();
  work.bytes_written = written->as_double();
  return work;
}

bool operator==(const task_work& x, const task_work& y) noexcept {
  return x.flops == y.flops && same_number(x.bytes_read, y.bytes_read) && same_number(x.bytes_written, y.bytes_written);
}

std::optional<task_bound> task_bound_from_json(const json_value& b) {
  if (!b.is_object())
    return std::nullopt;
  auto num = [&](const char* key) -> std::optional<double> {
    const auto* x = b.find(key);
    if (x == nullptr || !x->is_number() || !std::isfinite(x->as_double()) || x->as_double() < 0)
      return std::nullopt;
    return x->as_double();
  };
  const auto ms = num("ms"), bytes = num("bytes_ms"), flops = num("flops_ms");
  if (!ms || !bytes || !flops || *ms != std::max(*bytes, *flops))
    return std::nullopt;
  return task_bound{*ms, *bytes, *flops};
}

bool operator==(const task_bound& x, const task_bound& y) noexcept {
  return same_number(x.ms, y.ms) && same_number(x.bytes_ms, y.bytes_ms) && same_number(x.flops_ms, y.flops_ms);
}

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
         && x.precision_candidate == y.precision_candidate && x.judged == y.judged && x.work == y.work
         && x.bound == y.bound;
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
  if (!v.judged.empty())
    w.field("judged", v.judged);
  if (v.work.counted()) {
    w.key("work").begin_object().key("flops").begin_object();
    for (const auto& [dtype, n] : v.work.flops)
      w.field(dtype, n);
    w.end_object().field("bytes_read", v.work.bytes_read).field("bytes_written", v.work.bytes_written).end_object();
  }
  if (v.bound.known()) {
    w.key("bound").begin_object().field("ms", v.bound.ms).field("bytes_ms", v.bound.bytes_ms).field("flops_ms", v.bound.flops_ms).end_object();
    w.field("fraction", v.fraction()).field("fraction_of", v.fraction_of()).field("ref_fraction", v.ref_fraction());
  }
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
  auto doc = parse_json(json);
  if (!doc || !doc->is_object())
    return std::nullopt;
  const json_value& n = *doc;
  // A key missing or of another type turns `ok` false.
  bool ok = true;
  auto held = [&](const auto& x) {
    ok = ok && x.has_value();
    return x.value_or(typename std::decay_t<decltype(x)>::value_type{});
  };
  auto text = [&](const char* key) { return held(json_string(n.find(key))); };
  auto flag = [&](const char* key) { return held(json_bool(n.find(key))); };
  // Speedups and times: missing or null is NaN (no value).
  auto num = [&](const char* key) {
    const auto* x = n.find(key);
    if (x == nullptr || x->is_null())
      return static_cast<double>(NAN);
    if (!x->is_number()) {
      ok = false;
      return static_cast<double>(NAN);
    }
    return x->as_double();
  };
  verdict v;
  auto status = parse_verdict_status(text("status"));
  if (!ok || !status)
    return std::nullopt;
  v.status = *status;
  v.correct = flag("correct");
  v.speedup = num("speedup");
  v.speedup_spread = num("speedup_spread");
  v.ref_ms = num("ref_ms");
  v.cand_ms = num("cand_ms");
  v.reward = held(json_double(n.find("reward")));
  if (const auto* c = n.find("checks_failed"); c != nullptr && !c->is_null()) {
    if (!c->is_array())
      return std::nullopt;
    for (const auto& x : c->as_array()) {
      if (!x.is_string())
        return std::nullopt;
      v.checks_failed.push_back(x.as_string());
    }
  }
  v.message = text("message");
  v.hardware = text("hardware");
  v.cache_hit = flag("cache_hit");
  const auto rounds = held(json_uint(n.find("rounds")));
  if (rounds > std::numeric_limits<std::uint32_t>::max())
    return std::nullopt;
  v.rounds = static_cast<std::uint32_t>(rounds);
  v.wall_s = num("wall_s");
  v.baseline = text("baseline");
  // Absent in verdicts cached before they carried it, or where the worker could not count it.
  if (const auto* w = n.find("work"); w != nullptr && !w->is_null()) {
    auto work = task_work_from_json(*w);
    if (!work)
      return std::nullopt;
    v.work = std::move(*work);
  }
  // Absent where the evaluator had no peaks for its hardware, and in verdicts cached before
  // they carried it; the fractions are derived from it and the times.
  if (const auto* b = n.find("bound"); b != nullptr && !b->is_null()) {
    auto bound = task_bound_from_json(*b);
    if (!bound)
      return std::nullopt;
    v.bound = *bound;
  }
  // Absent in verdicts cached before they carried it, and in a task's check alone.
  if (const auto* j = n.find("judged"); j != nullptr && !j->is_null()) {
    if (!j->is_string())
      return std::nullopt;
    v.judged = j->as_string();
  }
  // Absent in verdicts cached before they carried a profile.
  if (const auto* p = n.find("profile"); p != nullptr && p->is_array())
    for (const auto& k : p->as_array()) {
      const auto* name = k.find("name");
      const auto* share = k.find("share");
      if (name == nullptr || !name->is_string() || share == nullptr || !share->is_number())
        return std::nullopt;
      v.profile.push_back({name->as_string(), share->as_double()});
    }
  v.own_share = num("own_share");
  if (!ok)
    return std::nullopt;
  // Absent in verdicts cached before they carried the sides' numeric settings.
  if (const auto* p = n.find("precision"); p != nullptr && p->is_object())
    for (const auto& [side, into] : {std::pair{"reference", &v.precision_reference}, std::pair{"candidate", &v.precision_candidate}})
      if (const auto* m = p->find(side); m != nullptr && m->is_object())
        for (const auto& [name, value] : m->as_object()) {
          if (!value.is_string())
            return std::nullopt;
          (*into)[name] = value.as_string();
        }
  return v;
}

} // namespace crucible::env
