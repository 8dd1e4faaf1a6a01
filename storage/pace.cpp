// The pace plan (storage/pace.hpp).
#include "storage/pace.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/json_parse.hpp"

namespace crucible::storage {

double pace_segment::evaluation_gpu_s_per_step() const {
  if (evaluator_gpus <= 0 || steps <= 0)
    return 0;
  if (evaluation_s > 0)
    return evaluation_s / static_cast<double>(steps);
  // Without the evaluations' own time: a step's samples at the verdicts a second per GPU seen,
  // which is what they cost only where the evaluators never waited for samples.
  if (verdicts <= 0 || step_s <= 0)
    return 0;
  const double per_gpu_s = verdicts_per_min() / 60.0 / evaluator_gpus;
  return static_cast<double>(samples) / static_cast<double>(steps) / per_gpu_s;
}

std::optional<std::int64_t> pace_segment::evaluator_gpus_needed() const {
  const double e = evaluation_gpu_s_per_step();
  if (e <= 0 || policy_step_s() <= 0)
    return std::nullopt;
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(e / policy_step_s() - 1e-9)));
}

std::optional<pace_plan> plan_for(const pace_segment& s, std::int64_t gpus) {
  const double e = s.evaluation_gpu_s_per_step();
  if (gpus < 1 || e <= 0 || s.policy_step_s() <= 0)
    return std::nullopt;
  pace_plan p;
  p.gpus = gpus;
  p.evaluation_s = e / static_cast<double>(gpus);
  const double policy = s.policy_step_s();
  p.async_step_s = std::max(policy, p.evaluation_s);
  p.sync_step_s = s.policy_serial_step_s() + p.evaluation_s;
  p.staleness = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil((policy + p.evaluation_s) / p.async_step_s - 1e-9)));
  return p;
}

std::vector<pace_segment> pace_segments(const std::vector<std::string>& lines) {
  std::vector<pace_segment> out;
  pace_segment cur;
  auto close = [&] {
    if (cur.steps > 0)
      out.push_back(cur);
    cur = pace_segment{};
  };
  // A record's number, string or flag; 0, "" or false where it is missing or of another type.
  auto number = [](const json_value& r, const char* key) {
    const auto* v = r.find(key);
    return v != nullptr && v->is_number() ? v->as_double() : 0.0;
  };
  auto text = [](const json_value& r, const char* key) {
    const auto* v = r.find(key);
    return v != nullptr && v->is_string() ? v->as_string() : std::string{};
  };
  auto flag = [](const json_value& r, const char* key) {
    const auto* v = r.find(key);
    return v != nullptr && v->is_bool() && v->as_bool();
  };
  for (const auto& line : lines) {
    const auto parsed = parse_json(line);
    if (!parsed || !parsed->is_object())
      continue;
    const json_value& r = *parsed;
    const auto event = text(r, "event");
    const auto stage = text(r, "stage");
    if (event == "run_started" || event == "run_resumed") {
      close();
    } else if (event == "train_step" && stage == "rl") {
      const auto step = static_cast<std::int64_t>(number(r, "step"));
      if (cur.steps == 0)
        cur.first_step = step;
      cur.last_step = step;
      ++cur.steps;
      cur.samples += static_cast<std::int64_t>(number(r, "samples"));
      cur.step_s += number(r, "step_seconds");
      cur.wait_s += number(r, "wait_seconds");
      cur.update_s += number(r, "seconds");
      if (const auto* m = r.find("staleness_mean"); m != nullptr && m->is_number()) {
        cur.staleness_sum += m->as_double();
        ++cur.staleness_steps;
        cur.staleness_max = std::max(cur.staleness_max, static_cast<std::int64_t>(number(r, "staleness_max")));
      }
    } else if (event == "train_step") {
      cur.other_stages = true;
    } else if (event == "verdict" && stage == "rl") {
      ++cur.verdicts;
    }
    if (const auto* d = r.find("devices"); d != nullptr && d->is_array()) {
      int gpus = 0;
      // Engines on GPUs without a learner rank generate at once, as the ranks update at once; a
      // GPU with both does its two parts one after the other already.
      double busiest = 0, evaluation = 0, engine_alone = 0, learner_alone = 0;
      for (const auto& dev : d->as_array()) {
        if (!dev.is_object())
          continue;
        if (flag(dev, "evaluator")) {
          ++gpus;
          evaluation += number(dev, "evaluation_s");
        }
        const double p = number(dev, "policy_s");
        busiest = std::max(busiest, p);
        const bool engine = flag(dev, "engine"), learner = flag(dev, "learner");
        if (engine && !learner)
          engine_alone = std::max(engine_alone, p);
        else if (learner && !engine)
          learner_alone = std::max(learner_alone, p);
      }
      cur.evaluator_gpus = gpus;
      cur.policy_s = busiest;
      cur.policy_serial_s = std::max(busiest, engine_alone + learner_alone);
      cur.evaluation_s = evaluation;
    }
  }
  close();
  for (auto& seg : out)
    if (seg.other_stages) {
      seg.policy_s.reset();
      seg.policy_serial_s.reset();
      seg.evaluation_s = 0; // the other stage's evaluations (the warm start's seeds) are in it too
    }
  return out;
}

std::string to_string(const pace_segment& s) {
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof buf, "RL steps %lld-%lld: %lld steps, %.1f s a step, %.0f%% waiting for evaluated groups, "
                "%.1f%% in updates; %.1f verdicts/min",
                static_cast<long long>(s.first_step), static_cast<long long>(s.last_step),
                static_cast<long long>(s.steps), s.step_s / static_cast<double>(s.steps), 100.0 * s.wait_share(),
                s.step_s > 0 ? 100.0 * s.update_s / s.step_s : 0.0, s.verdicts_per_min());
  out += buf;
  if (s.evaluator_gpus > 0) {
    std::snprintf(buf, sizeof buf, " on %d evaluator GPU%s (%.1f each)", s.evaluator_gpus,
                  s.evaluator_gpus == 1 ? "" : "s", s.verdicts_per_min() / s.evaluator_gpus);
    out += buf;
  }
  if (s.policy_step_s() > 0) {
    const bool policy = s.policy_s && *s.policy_s > 0;
    const bool apart = s.policy_serial_step_s() > s.policy_step_s(); // the engine on a GPU of its own
    std::snprintf(buf, sizeof buf, "; the %s (%.2f s a step%s) would take %.0f verdicts/min",
                  policy ? "policy's generation and updates" : "learner's updates alone", s.policy_step_s(),
                  apart ? " on its busiest GPU" : "", s.verdicts_needed_per_min());
    out += buf;
    if (apart) {
      std::snprintf(buf, sizeof buf, " (generation and updates one after the other: %.2f s)",
                    s.policy_serial_step_s());
      out += buf;
    }
    if (const auto n = s.evaluator_gpus_needed()) {
      std::snprintf(buf, sizeof buf, ": about %lld evaluator GPU%s at this rate", static_cast<long long>(*n),
                    *n == 1 ? "" : "s");
      out += buf;
      if (const auto p = plan_for(s, *n)) {
        std::snprintf(buf, sizeof buf,
                      "; plan: on %lld evaluator GPU%s a step takes %.2f s asynchronous, up to %.2f s synchronous "
                      "(%.2fx), max_staleness %lld keeps every group",
                      static_cast<long long>(p->gpus), p->gpus == 1 ? "" : "s", p->async_step_s, p->sync_step_s,
                      p->sync_step_s / p->async_step_s, static_cast<long long>(p->staleness));
        out += buf;
      }
      if (const auto own = plan_for(s, s.evaluator_gpus)) {
        std::snprintf(buf, sizeof buf, "; on this run's %d: %.2f s asynchronous, up to %.2f s synchronous, %.2f s measured",
                      s.evaluator_gpus, own->async_step_s, own->sync_step_s, s.step_s / static_cast<double>(s.steps));
        out += buf;
      }
    }
  }
  if (s.staleness_steps > 0) {
    std::snprintf(buf, sizeof buf, "; trained samples up to %lld version%s old (mean %.2f)",
                  static_cast<long long>(s.staleness_max), s.staleness_max == 1 ? "" : "s", s.staleness_mean());
    out += buf;
  }
  return out;
}

} // namespace crucible::storage
