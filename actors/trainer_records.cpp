// actors/trainer_records.cpp: what a trainer step writes: a verdict record per scored variant
// (with the run's tallies), a train_step record per update with its progress text, and the step's
// stage_report. Functions of the trainer's state only; trainer_step.cpp and trainer.cpp call them.
#include "actors/trainer_state.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <utility>

#include "core/json.hpp"
#include "core/progress.hpp"
#include "env/eval/device_gate.hpp"

namespace crucible::trainer_detail {

// The current stage's step count and time limit (stages.NAME.steps, max_minutes); nullopt after
// the last stage.
std::optional<std::pair<std::int64_t, double>> stage_limits(const trainer_state& st) {
  const auto& g = st.deps->cfg.stages;
  switch (st.p.stage) {
    case stage_sft: return std::pair{g.sft.steps, g.sft.max_minutes};
    case stage_self: return std::pair{g.self_supervised.steps, g.self_supervised.max_minutes};
    case stage_rl: return std::pair{g.rl.steps, g.rl.max_minutes};
    case stage_search: return std::pair{g.search.steps, g.search.max_minutes};
    default: return std::nullopt;
  }
}

stage_report report_of(trainer_state& st, bool done) {
  stage_report r;
  r.stage = stage_name(st.p.stage);
  r.stage_step = st.p.stage_step;
  r.step = st.p.step;
  r.done = done;
  r.policy_version = policy_version{st.p.version};
  r.variants = st.p.variants;
  r.best_speedup = st.p.best_speedup;
  r.mean_speedup = st.p.correct ? st.p.speedup_sum / st.p.correct : std::numeric_limits<double>::quiet_NaN();
  r.dropped_stale = st.p.dropped_stale;
  r.discarded = st.p.discarded;
  r.unfinished = st.p.unfinished;
  r.skipped_tasks = st.warm.skipped;
  const auto& cfg = st.deps->cfg;
  const auto learners = learner_devices(cfg);
  const auto engines = engine_devices(cfg);
  auto listed = [](const std::vector<std::string>& in, const std::string& device) {
    return std::find(in.begin(), in.end(), device) != in.end();
  };
  for (const auto& u : env::device_uses())
    r.devices.push_back(
      {u.device, u.seconds, u.evaluation_s, u.policy_s, u.evaluator, listed(engines, u.device), listed(learners, u.device)});
  r.records = std::move(st.step.records);
  st.step.records.clear();
  return r;
}

// Counts a scored variant into the run's tallies and writes its verdict record.
void count_verdict(trainer_state& st, const task_id& task, const verdict& v, std::uint64_t version, std::uint64_t group,
                   sample_tally* tally, int turn, bool seed) {
  ++st.p.variants;
  const bool good = v.correct && v.status == verdict_status::ok && v.has_speedup();
  if (good && !seed) { // the run's best and mean are the policy's: a seed variant's speedup is the suite's
    ++st.p.correct;
    st.p.speedup_sum += v.speedup;
    if (std::isnan(st.p.best_speedup) || v.speedup > st.p.best_speedup)
      st.p.best_speedup = v.speedup;
  }
  auto add = [&](sample_counts& c) {
    ++c.samples;
    if (good) {
      ++c.correct;
      c.speedup_sum += v.speedup;
    }
  };
  if (tally) {
    add(*tally);
    tally->reward_sum += v.reward;
    if (v.status == verdict_status::format_error)
      ++tally->format_errors;
    if (turn >= 0) {
      if (tally->turns.size() <= static_cast<std::size_t>(turn))
        tally->turns.resize(static_cast<std::size_t>(turn) + 1);
      add(tally->turns[static_cast<std::size_t>(turn)]);
    }
  }
  json_writer w;
  w.begin_object()
    .field("event", "verdict")
    .field("time", time_now(st))
    .field("stage", stage_name(st.p.stage))
    .field("step", st.p.step)
    .field("task", task.value)
    .field("status", to_string(v.status))
    .field("correct", v.correct)
    .field("speedup", v.speedup)
    .field("reward", v.reward)
    .field("hardware", st.kind)
    .field("policy_version", version)
    .field("group", group)
    .field("cache_hit", v.cache_hit);
  if (turn >= 0)
    w.field("turn", static_cast<std::int64_t>(turn));
  // How far from the hardware's limit (evaluator.limits), where the verdict knows its bound.
  if (v.bound.known())
    w.field("bound_ms", v.bound.ms)
      .field("fraction", v.fraction())
      .field("fraction_of", v.fraction_of())
      .field("ref_fraction", v.ref_fraction());
  w.end_object();
  st.step.records.push_back(std::move(w).take());
}

// "step 120/700, 3.41 s a step, 32m58s left": the stage's count, its rate so far (the stage's
// seconds across resumes) and the time left at that rate (or to stages.NAME.max_minutes, if
// sooner).
std::string stage_progress_text(const trainer_state& st) {
  const auto limits = stage_limits(st);
  if (!limits || st.p.stage_step == 0)
    return {};
  const auto [steps, minutes] = *limits;
  const double elapsed = now_seconds(st);
  const double per_step = elapsed / static_cast<double>(st.p.stage_step);
  double left = per_step * static_cast<double>(std::max<std::int64_t>(0, steps - static_cast<std::int64_t>(st.p.stage_step)));
  if (minutes > 0)
    left = std::min(left, std::max(0.0, minutes * 60.0 - elapsed));
  char buf[96];
  std::snprintf(buf, sizeof buf, "step %llu/%lld, %.2f s a step, ", static_cast<unsigned long long>(st.p.stage_step),
                static_cast<long long>(steps), per_step);
  return buf + duration_text(left) + " left";
}

// The train_step record of an update.
std::string train_record(trainer_state& st, const train_report& r, const sample_tally* tally, std::size_t groups) {
  json_writer w;
  w.begin_object()
    .field("event", "train_step")
    .field("time", time_now(st))
    .field("stage", stage_name(st.p.stage))
    .field("step", st.p.step)
    .field("stage_step", st.p.stage_step)
    .field("policy_version", r.policy_version.value)
    .field("loss", r.loss)
    .field("grad_norm", r.grad_norm)
    .field("lr", r.lr)
    .field("tokens", r.tokens)
    .field("sequences", r.sequences)
    .field("zero_advantage", r.zero_advantage)
    .field("seconds", r.seconds)
    .field("publish_seconds", r.publish_seconds)
    .field("step_seconds", seconds_since(st.step.began))
    .field("wait_seconds", st.step.wait_seconds)
    .field("prep_seconds", st.step.prep_seconds)
    .field("skipped", r.skipped)
    .field("groups", static_cast<std::uint64_t>(groups));
  if (tally) {
    w.field("mean_reward", tally->samples ? tally->reward_sum / tally->samples : 0.0)
      .field("samples", tally->samples)
      .field("correct_share", tally->correct_share())
      .field("format_error_share", tally->samples ? static_cast<double>(tally->format_errors) / tally->samples : 0.0)
      .field("mean_speedup", tally->mean_speedup())
      .field("best_speedup", st.p.best_speedup)
      .field("dropped_stale", st.roll.dropped_now)
      .field("staleness_max", st.step.staleness_max)
      .field("staleness_mean", st.step.staleness_mean);
    if (!tally->turns.empty()) { // multi-turn episodes: the same by turn (from 0)
      w.key("turns").begin_array();
      for (std::size_t t = 0; t < tally->turns.size(); ++t) {
        const auto& c = tally->turns[t];
        w.begin_object()
          .field("turn", static_cast<std::uint64_t>(t))
          .field("samples", c.samples)
          .field("correct_share", c.correct_share())
          .field("mean_speedup", c.mean_speedup())
          .end_object();
      }
      w.end_array();
    }
  }
  w.end_object();
  return std::move(w).take();
}

} // namespace crucible::trainer_detail
