// Learner actor: complete GRPO groups (or SFT examples) in, one data-parallel update per request,
// step metrics out; rank 0 publishes each new version to the engines.
#include "actors/learner.hpp"

#include <chrono>
#include <caf/all.hpp>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <system_error>
#include <utility>

#include "actors/actor_config.hpp"
#include "core/progress.hpp"
#include "env/eval/device_gate.hpp"
#include "policy/training/checkpoint.hpp"
#include "policy/training/episode_batch.hpp"
#include "policy/distributed/collective.hpp"
#include "policy/training/learner.hpp"
#include "policy/model/model.hpp"
#include "policy/runtime.hpp"

namespace crucible {

namespace {

// The learner's view of a complete group: prompt, completions with their behaviour log-probs,
// verdict rewards, and the oldest version that sampled it. errc::invalid_arg naming the group
// when verdicts and completions differ in number or a reward is not finite.
result<std::vector<policy::grpo_group>> to_grpo_groups(const rollout_group& g, const learner_options& o);

} // namespace

result<void> learner_actor_spec::validate() const {
  if (backend != "inproc" && backend != "nccl")
    return fail(errc::config, "learner_actor.backend: must be inproc or nccl, got '", backend, "'");
  if (world_size < 1)
    return fail(errc::config, "learner_actor.world_size: must be at least 1, got ", std::to_string(world_size));
  if (rank < 0 || rank >= world_size)
    return fail(errc::config, "learner_actor.rank: must be in [0, ", std::to_string(world_size), "), got ",
                std::to_string(rank));
  if (!(timeout_s > 0) || !(timeout_s <= 7 * 24 * 3600.0))
    return fail(errc::config, "learner_actor.timeout_s: must be > 0 and at most 604800 (a week)");
  if (!(temperature > 0) || !std::isfinite(temperature))
    return fail(errc::config, "learner_actor.temperature: must be a positive number");
  if (backend == "nccl") {
    if (auto id = policy::nccl_id::from_hex(nccl_id_hex); !id.ok())
      return fail(errc::config, "learner_actor.nccl_id_hex: ", id.error().message);
    if (device < 0)
      return fail(errc::config, "learner_actor.device: must be a CUDA device ordinal, got ", std::to_string(device));
  } else if (world_size > 1) {
    if (!group)
      return fail(errc::config, "learner_actor.group: an inproc group of ", std::to_string(world_size),
                  " ranks needs the shared group");
    if (group->size() != world_size)
      return fail(errc::config, "learner_actor.group: the group has ", std::to_string(group->size()),
                  " ranks, world_size is ", std::to_string(world_size));
  }
  return {};
}

namespace {

// A group of multi-turn episodes as rows: each turn of each episode one row after its own context,
// with its turn-level advantage (policy/training/episode_batch.hpp, the options' turn_return,
// turn_gamma, turn_advantage, std_normalize and std_eps).
result<std::vector<policy::grpo_group>> episode_rows(const rollout_group& g, const learner_options& o) {
  const auto n = g.completions.size();
  const auto who = "group " + to_string(g.group) + ": ";
  if (g.episodes.size() != n || g.turns.size() != n || g.contexts.size() != n)
    return fail(errc::invalid_arg, who, std::to_string(n), " completions but ", std::to_string(g.episodes.size()),
                " episode numbers, ", std::to_string(g.turns.size()), " turns and ", std::to_string(g.contexts.size()),
                " contexts");
  // Episodes in order of their number, each one's turns in order; turns 0, 1, ... without a gap.
  std::map<std::uint32_t, std::map<std::uint32_t, std::size_t>> at;
  for (std::size_t i = 0; i < n; ++i)
    if (!at[g.episodes[i]].emplace(g.turns[i], i).second)
      return fail(errc::invalid_arg, who, "episode ", std::to_string(g.episodes[i]), " has turn ",
                  std::to_string(g.turns[i]), " twice");
  std::vector<policy::scored_episode> episodes;
  std::uint64_t version = UINT64_MAX;
  for (const auto& [episode, turns] : at) {
    policy::scored_episode e;
    std::uint32_t expect = 0;
    for (const auto& [turn, i] : turns) {
      if (turn != expect++)
        return fail(errc::invalid_arg, who, "episode ", std::to_string(episode), " lacks turn ",
                    std::to_string(expect - 1));
      const auto& c = g.completions[i];
      if (!std::isfinite(g.verdicts[i].reward))
        return fail(errc::invalid_arg, who, "episode ", std::to_string(episode), " turn ", std::to_string(turn),
                    " has a reward that is not finite");
      e.tokens.completions.push_back(c.token_ids);
      e.behaviour_log_probs.push_back(c.logprobs);
      e.rewards.push_back(g.verdicts[i].reward);
      e.contexts.push_back(g.contexts[i]);
      version = std::min(version, c.policy_version.value);
    }
    episodes.push_back(std::move(e));
  }
  policy::episode_options opt;
  opt.returns = o.turn_returns;
  opt.gamma = o.turn_gamma;
  opt.advantages = o.turn_advantages;
  opt.std_normalize = o.std_normalize;
  opt.eps = o.std_eps;
  auto rows = policy::episode_groups(episodes, opt, n == 0 ? 0 : version);
  if (!rows)
    return fail(errc::invalid_arg, who, rows.error().message);
  return rows;
}

result<std::vector<policy::grpo_group>> to_grpo_groups(const rollout_group& g, const learner_options& o) {
  if (g.verdicts.size() != g.completions.size())
    return fail(errc::invalid_arg, "group ", to_string(g.group), ": ", std::to_string(g.completions.size()),
                " completions but ", std::to_string(g.verdicts.size()), " verdicts");
  if (g.multi_turn())
    return episode_rows(g, o);
  policy::grpo_group out;
  out.prompt = g.prompt_token_ids;
  out.policy_version = UINT64_MAX;
  for (std::size_t i = 0; i < g.completions.size(); ++i) {
    const auto& c = g.completions[i];
    if (!std::isfinite(g.verdicts[i].reward))
      return fail(errc::invalid_arg, "group ", to_string(g.group), ": completion ", std::to_string(i),
                  " has a reward that is not finite");
    out.samples.push_back({c.token_ids, c.logprobs, g.verdicts[i].reward});
    out.policy_version = std::min(out.policy_version, c.policy_version.value);
  }
  if (g.completions.empty())
    out.policy_version = 0;
  return std::vector<policy::grpo_group>{std::move(out)};
}

struct learner_state {
  learner_state() = default; // not an aggregate (see actors/engine.cpp's runner_state)

  std::shared_ptr<policy::learner> learner;
  std::vector<engine_actor> engines;
  std::function<result<void>(std::uint64_t)> stage_weights;
  logger* log = nullptr;
  learner_actor_spec spec;
  bool joined = false;
  crucible::error join_error; // errc::none until joining fails; then every request gets it
  std::vector<rollout_group> queued;
  std::deque<std::filesystem::path> published;
  static inline const char* name = "crucible.learner";
};

using learner_pointer = learner_actor::stateful_pointer<learner_state>;

// An NCCL rank's thread works on the rank's GPU: kernels launched outside LibTorch's own ops (the
// fused training kernels, the collectives' events) go to the current device, which on the actor's
// thread is otherwise cuda:0. Held for the length of a request.
// `update()` holding this rank's GPU as host work: where an evaluator of this process times on
// the same GPU, none of its measured rounds overlaps the update (env::device_gate).
template <class F>
auto on_own_device(const learner_state& st, F&& update) {
  const auto gate = env::gate_for_host_work(st.spec.device_name);
  env::host_hold hold{gate.get()};
  return update();
}

policy::device_scope on_rank_device(const learner_state& st) {
  return policy::device_scope(st.spec.backend == "nccl" ? "cuda:" + std::to_string(st.spec.device) : "cpu");
}

// Makes the communicator and joins the data-parallel group, once (collective). A learner that
// joined its group before the actor was spawned (the run does, to restore a checkpoint on every
// rank before the engine is built from rank 0) is taken as it is, once its rank and size match.
result<void> ensure_joined(learner_state& st) {
  if (st.joined)
    return {};
  if (st.join_error.code != errc::none)
    return st.join_error;
  const auto& s = st.spec;
  auto fail_join = [&](crucible::error e) -> result<void> {
    e.message = "learner rank " + std::to_string(s.rank) + " of " + std::to_string(s.world_size) +
                ": joining the data-parallel group: " + e.message;
    st.join_error = e;
    return e;
  };
  if (auto* dp = st.learner->data_parallel_state(); dp != nullptr) {
    if (dp->comm().rank() != s.rank || dp->comm().size() != s.world_size)
      return fail_join(crucible::error{errc::config, "the learner already joined a group as rank " +
                                                       std::to_string(dp->comm().rank()) + " of " +
                                                       std::to_string(dp->comm().size())});
  } else if (s.world_size > 1) {
    auto make_comm = [&]() -> result<std::shared_ptr<policy::communicator>> {
      if (s.backend != "nccl")
        return s.group->join(s.rank);
      auto id = policy::nccl_id::from_hex(s.nccl_id_hex);
      if (!id.ok())
        return id.error();
      return policy::make_nccl_communicator(*id, s.rank, s.world_size, s.device,
                                            std::chrono::milliseconds(static_cast<std::int64_t>(s.timeout_s * 1e3)));
    };
    auto comm = make_comm();
    if (!comm.ok())
      return fail_join(comm.error());
    if (auto j = st.learner->join_data_parallel(*comm); !j.ok())
      return fail_join(j.error());
  }
  st.joined = true;
  return {};
}

// Sends `message` (weights_published or weight_update of `version`) to every engine; a refusal is
// printed, not fatal: the engine keeps serving the version it had.
template <class Message>
void announce(learner_pointer self, std::uint64_t version, const Message& message) {
  for (const auto& engine : self->state.engines)
    self->request(engine, caf::infinite, message)
      .then([](policy_version) {},
            [self, version](const caf::error& err) {
              aout(self) << "learner: engine refused weights of version " << version << ": "
                         << to_error(err).message << "\n";
            });
}

// Rank 0: hands the new weights to every engine, in memory (stage_weights) or as an HF directory.
result<void> publish(learner_pointer self, std::uint64_t version) {
  auto& st = self->state;
  if (st.spec.rank != 0)
    return {};
  if (st.stage_weights) {
    if (auto staged = st.stage_weights(version); !staged.ok())
      return fail(staged.error().code, "handing version ", std::to_string(version), " to the engine: ",
                  staged.error().message);
    announce(self, version, weights_published{policy_version{version}, 0, 0});
    return {};
  }
  if (st.spec.publish_dir.empty())
    return {};
  const auto dir = st.spec.publish_dir / ("v" + std::to_string(version));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec); // a partial directory of an earlier failed attempt
  policy::save_options so;
  so.dtype = st.learner->model().parameters().front().scalar_type(); // as trained: no rounding
  so.tokenizer_from = st.spec.tokenizer_dir;
  if (auto ok = policy::save_model(st.learner->model(), dir, so); !ok.ok())
    return fail(errc::io, "publishing version ", std::to_string(version), " to ", dir.string(), ": ",
                ok.error().message);
  st.published.push_back(dir);
  while (st.spec.keep_published > 0 && st.published.size() > st.spec.keep_published) {
    std::filesystem::remove_all(st.published.front(), ec);
    st.published.pop_front();
  }
  announce(self, version, weight_update{dir.string(), policy_version{version}});
  return {};
}

train_report report_of(const policy::step_metrics& m, const policy::learner& l, std::uint64_t groups,
                       std::uint64_t dropped) {
  train_report r;
  r.policy_version = policy_version{m.version};
  r.step = static_cast<std::uint64_t>(l.steps());
  r.groups = groups;
  r.dropped_stale = dropped;
  r.loss = m.loss;
  r.mean_reward = m.reward_mean;
  r.grad_norm = m.grad_norm;
  r.lr = m.lr;
  r.seconds = m.seconds;
  r.tokens = static_cast<std::uint64_t>(m.tokens);
  r.sequences = static_cast<std::uint64_t>(m.sequences);
  r.zero_advantage = static_cast<std::uint64_t>(m.zero_advantage);
  r.skipped = m.skipped;
  return r;
}

// The report of an update, after rank 0 published its weights (unless it was skipped); the
// publication's time goes into the report.
caf::result<train_report> published_report(learner_pointer self, const policy::step_metrics& m, std::uint64_t groups,
                                           std::uint64_t dropped) {
  const auto began = std::chrono::steady_clock::now();
  if (!m.skipped)
    if (auto p = publish(self, m.version); !p.ok())
      return make_error(p.error());
  auto r = report_of(m, *self->state.learner, groups, dropped);
  r.publish_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return r;
}

// One GRPO update on this rank's groups. A group that cannot be converted still takes part: the
// learner is handed an empty batch, which it refuses in a way that fails the other ranks at once.
caf::result<train_report> grpo_update(learner_pointer self, const std::vector<const rollout_group*>& groups,
                                      double temperature, std::uint64_t dropped) {
  auto& st = self->state;
  const auto device = on_rank_device(st);
  if (auto j = ensure_joined(st); !j.ok())
    return make_error(j.error());
  policy::grpo_batch batch;
  batch.temperature = temperature;
  crucible::error bad{errc::none, {}};
  for (const auto* g : groups) {
    auto converted = to_grpo_groups(*g, st.learner->options());
    if (!converted.ok()) {
      bad = converted.error();
      break;
    }
    for (auto& row : *converted)
      batch.groups.push_back(std::move(row));
  }
  if (bad.code != errc::none) {
    batch.groups.clear();
    (void)st.learner->grpo_step(batch);
    return make_error(bad);
  }
  auto m = on_own_device(st, [&] { return st.learner->grpo_step(batch); });
  if (!m.ok())
    return make_error(m.error());
  return published_report(self, *m, groups.size(), dropped);
}

learner_actor::behavior_type learner_fn(learner_pointer self, learner_actor_deps deps, learner_actor_spec spec) {
  auto& init = self->state;
  init.learner = std::move(deps.learner);
  init.engines = std::move(deps.engines);
  init.stage_weights = std::move(deps.stage_weights);
  init.log = deps.log;
  init.spec = std::move(spec);
  return {
    [=](rollout_group& g) { self->state.queued.push_back(std::move(g)); },
    [=](train_atom) -> caf::result<train_report> {
      auto& st = self->state;
      auto queued = std::move(st.queued);
      st.queued.clear();
      const auto now = st.learner->version();
      std::vector<const rollout_group*> fresh;
      std::uint64_t dropped = 0;
      for (const auto& g : queued) {
        std::uint64_t oldest = now;
        for (const auto& c : g.completions)
          oldest = std::min(oldest, c.policy_version.value);
        if (st.spec.max_staleness > 0 && now - oldest > st.spec.max_staleness)
          ++dropped;
        else
          fresh.push_back(&g);
      }
      return grpo_update(self, fresh, st.spec.temperature, dropped);
    },
    [=](const learner_batch& b) -> caf::result<train_report> {
      const auto& s = self->state.spec;
      std::vector<const rollout_group*> mine;
      for (std::size_t i = static_cast<std::size_t>(s.rank); i < b.groups.size();
           i += static_cast<std::size_t>(s.world_size))
        mine.push_back(&b.groups[i]);
      return grpo_update(self, mine, b.temperature, 0);
    },
    [=](const sft_batch& b) -> caf::result<train_report> {
      auto& st = self->state;
      const auto device = on_rank_device(st);
      if (auto j = ensure_joined(st); !j.ok())
        return make_error(j.error());
      std::vector<policy::sft_example> mine;
      const bool consistent = b.prompts.size() == b.completions.size();
      if (consistent)
        for (std::size_t i = static_cast<std::size_t>(st.spec.rank); i < b.prompts.size();
             i += static_cast<std::size_t>(st.spec.world_size))
          mine.push_back({b.prompts[i], b.completions[i]});
      auto m = on_own_device(st, [&] { return st.learner->sft_step(mine); }); // an empty share is refused on every rank
      if (!consistent)
        return make_error(errc::invalid_arg, "sft_batch: " + std::to_string(b.prompts.size()) + " prompts but " +
                                               std::to_string(b.completions.size()) + " completions");
      if (!m.ok())
        return make_error(m.error());
      return published_report(self, *m, mine.size(), 0);
    },
    [=](reset_atom) {
      const auto device = on_rank_device(self->state);
      self->state.learner->reset_moments();
    },
    [=](save_atom, const std::string& dir) -> caf::result<policy_version> {
      auto& st = self->state;
      const auto device = on_rank_device(st);
      if (auto j = ensure_joined(st); !j.ok())
        return make_error(j.error());
      std::optional<progress_meter> meter;
      policy::checkpoint_progress progress;
      if (st.log != nullptr) {
        meter.emplace(*st.log, "checkpoint", progress_unit::bytes);
        progress = [&meter](std::string_view what, std::uint64_t done, std::uint64_t total) {
          meter->update(what, done, total);
        };
      }
      if (auto ok = policy::save_checkpoint(*st.learner, dir, st.spec.tokenizer_dir, progress); !ok.ok())
        return make_error(ok.error());
      return policy_version{st.learner->version()};
    },
  };
}

} // namespace

result<learner_actor> spawn_learner_actor(caf::actor_system& sys, learner_actor_deps deps, learner_actor_spec spec) {
  if (auto ok = spec.validate(); !ok.ok())
    return ok.error();
  if (!deps.learner)
    return fail(errc::invalid_arg, "learner actor: no learner");
  for (const auto& e : deps.engines)
    if (!e)
      return fail(errc::invalid_arg, "learner actor: an invalid engine handle");
  learner_actor h = sys.spawn<caf::detached>(learner_fn, std::move(deps), std::move(spec));
  return h;
}

} // namespace crucible
