// actors/trainer.cpp: the trainer actor: its messages, its checkpoints and spawn_trainer. A
// step of the schedule (advance_atom) is run top to bottom by run_step in trainer_step.cpp; the
// rollout places and their groups are in trainer_rollouts.cpp, the state all three share in
// trainer_state.hpp, and the trainer's files (seed variants, trainer.json, samplers.json) in
// trainer_files.cpp. Calls go one way: this file -> trainer_step.cpp -> trainer_rollouts.cpp.
#include "actors/trainer.hpp"
#include "actors/trainer_state.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include "actors/actor_config.hpp"
#include "actors/exemplar.hpp"
#include "core/file_io.hpp"
#include "storage/replay_store.hpp"

namespace fs = std::filesystem;

namespace crucible {

namespace trainer_detail {

// -- checkpoints -------------------------------------------------------------------------------

void prune_checkpoints(trainer_state& st, const fs::path& root, const std::string& keep_name) {
  std::vector<std::pair<std::uint64_t, fs::path>> all;
  std::error_code ec;
  for (auto it = fs::directory_iterator(root, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (it->is_directory() && name.rfind("step-", 0) == 0 && name != keep_name) {
      try {
        all.emplace_back(std::stoull(name.substr(5)), it->path());
      } catch (...) {
      }
    }
  }
  std::sort(all.begin(), all.end());
  const auto keep = static_cast<std::size_t>(std::max<std::int64_t>(1, st.deps->cfg.run.keep_checkpoints)) - 1;
  while (all.size() > keep) {
    fs::remove_all(all.front().second, ec);
    all.erase(all.begin());
  }
}

// Answers everyone waiting for the checkpoint `name` (trainer_state::saving) with `what`, the
// directory written or an error.
template <class T>
void finish_save(self_pointer self, const std::string& name, const T& what) {
  auto node = self->state.saving.extract(name);
  if (node.empty())
    return;
  for (auto& rp : node.mapped())
    rp.deliver(what);
}

// The learner's checkpoint into `tmp`, then trainer.json and samplers.json beside it; `tmp`
// becomes `root/name` and `latest` names it. Answers through finish_save.
void write_checkpoint(self_pointer self, fs::path tmp, std::string name, trainer_progress progress,
                      std::string samplers) {
  auto& st = self->state;
  auto finish = [self, tmp, name, progress, samplers](policy_version) {
    auto& st = self->state;
    const auto root = tmp.parent_path();
    const auto dir = root / name;
    for (auto [file, text] : {std::pair{"trainer.json", progress.to_json()}, std::pair{"samplers.json", samplers}})
      if (auto r = write_file_atomic(tmp / file, text); !r) {
        finish_save(self, name, make_error(r.error()));
        return;
      }
    std::error_code ec;
    fs::rename(tmp, dir, ec);
    if (ec) {
      finish_save(self, name,
                  make_error(errc::io, "cannot rename " + tmp.string() + " to " + dir.string() + ": " + ec.message()));
      return;
    }
    if (auto r = fsync_directory(root); !r) {
      finish_save(self, name, make_error(r.error()));
      return;
    }
    if (auto r = write_file_atomic(root / "latest", name + "\n"); !r) {
      finish_save(self, name, make_error(r.error()));
      return;
    }
    prune_checkpoints(st, root, name);
    st.deps->log->info(component, "checkpoint ", dir.string());
    finish_save(self, name, dir.string());
  };
  if (!st.deps->learner) { // behind an endpoint: the trainer's own files only
    finish(policy_version{st.p.version});
    return;
  }
  self->request(st.deps->learner, learner_wait(st), save_atom_v, (tmp / "learner").string())
    .then(
      finish,
      [self, name](const caf::error& e) {
        if (e == caf::sec::request_timeout)
          finish_save(self, name, make_error(learner_error(self->state, e, "a checkpoint save")));
        else
          finish_save(self, name, e);
      });
}

caf::result<std::string> save(self_pointer self) {
  auto& st = self->state;
  const auto root = st.deps->run_dir / "checkpoints";
  const auto name = "step-" + std::to_string(st.p.step);
  const auto dir = root / name;
  std::error_code ec;
  if (fs::exists(dir / "trainer.json", ec))
    return dir.string(); // this step is saved already
  if (auto writing = st.saving.find(name); writing != st.saving.end()) {
    auto rp = self->make_response_promise<std::string>();
    writing->second.push_back(rp); // being saved: answered when that save ends
    return rp;
  }
  const auto tmp = root / ("." + name + ".tmp");
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec)
    return make_error(errc::io, "cannot create " + tmp.string() + ": " + ec.message());
  auto progress = st.p;
  progress.stage_seconds = st.p.stage >= stage_sft && st.p.stage < stage_done ? now_seconds(st) : 0.0;
  auto rp = self->make_response_promise<std::string>();
  st.saving[name].push_back(rp);
  // Rollout actors that run (async) are asked for their samplers; stopped places keep theirs.
  collect_samplers(self, [self, tmp, name, progress] {
    write_checkpoint(self, tmp, name, progress, sampler_checkpoint{self->state.roll.samplers}.to_json());
  });
  return rp;
}


trainer_impl_actor::behavior_type trainer(self_pointer self, std::shared_ptr<trainer_shared> shared) {
  auto& st = self->state;
  st.shared = shared;
  st.deps = &shared->deps;
  st.p = st.deps->progress;
  st.roll.samplers = st.deps->samplers;
  st.stage_start = std::chrono::steady_clock::now();
  // The exemplar actor goes down with the trainer; the rollout actors follow it (they quit when
  // a collaborator goes down).
  self->attach_functor([shared](const caf::error&) {
    if (shared->exemplars)
      caf::anon_send_exit(shared->exemplars, caf::exit_reason::user_shutdown);
  });
  return {
    [self](advance_atom) -> caf::result<stage_report> {
      auto& st = self->state;
      st.exemplars = st.shared->exemplars;
      if (st.step.busy)
        return make_error(errc::busy, "a step of the schedule is already under way");
      st.step.busy = true;
      st.step.began = std::chrono::steady_clock::now();
      st.step.wait_seconds = st.step.prep_seconds = 0;
      st.step.staleness_max = 0;
      st.step.staleness_mean = 0;
      st.step.pending = self->make_response_promise<stage_report>();
      auto rp = st.step.pending;
      run_step(self);
      return rp;
    },
    [self](stop_atom) -> caf::result<stage_report> {
      auto& st = self->state;
      st.exemplars = st.shared->exemplars;
      auto rp = self->make_response_promise<stage_report>();
      const auto how = st.deps->cfg.run.on_pause;
      stop_rollouts(self, how, [self, rp]() mutable {
        auto& st = self->state;
        // Groups that finished are in the store; their verdicts are reported, not trained on
        // (the next process samples its own).
        count_groups(st, st.roll.groups, nullptr);
        send_fates(self, group_ids(st.roll.groups), storage::sample_fate::paused, st.p.step);
        st.roll.groups.clear();
        settle_samples(self, -1, [self, rp]() mutable {
          rp.deliver(report_of(self->state, self->state.p.stage >= stage_done));
        });
      });
      return rp;
    },
    [self](save_atom) -> caf::result<std::string> { return save(self); },
    [self](drain_atom) -> std::string { return drain_step(self); },
    [self](rollout_group& g) { group_arrived(self, std::move(g)); },
    [self](group_dropped& d) { readmit(self, {d.group}); },
    [self](stall_atom, std::uint64_t wait, std::uint64_t seen) { stall_check(self, wait, seen); },
    [self](collect_atom) { retry_waiting(self); },
  };
}

} // namespace trainer_detail

result<trainer_actor> spawn_trainer(caf::actor_system& sys, trainer_deps deps) {
  using trainer_detail::trainer;
  using trainer_detail::trainer_shared;
  // Behind an endpoint (policy.backend openai) nothing trains: no learner, and the configuration
  // allows no stage that updates.
  const bool endpoint = deps.cfg.policy.backend == "openai";
  const bool engines = !deps.engines.empty() && std::all_of(deps.engines.begin(), deps.engines.end(),
                                                             [](const engine_actor& e) { return bool(e); });
  if ((!deps.learner && !endpoint) || !engines || !deps.evaluators)
    return fail(errc::invalid_arg, "trainer: a learner, an engine and an evaluator pool are needed");
  const auto& g = deps.cfg.stages;
  if (!deps.learner && (g.sft.steps > 0 || g.self_supervised.steps > 0 || g.rl.steps > 0))
    return fail(errc::invalid_arg, "trainer: a stage that updates the policy needs a learner");
  if (!deps.tasks || deps.tasks->empty())
    return fail(errc::invalid_arg, "trainer: the task catalogue is empty");
  if ((!deps.tokenizer && !endpoint) || !deps.prompts.builder || deps.clk == nullptr || deps.log == nullptr)
    return fail(errc::invalid_arg, "trainer: a tokenizer, a prompt builder, a clock and a logger are needed");
  auto xopt = exemplar_actor_options::from(deps.cfg, deps.run_dir / "replay.db");
  xopt.detached = deps.exemplar_detached;
  auto shared = std::make_shared<trainer_shared>();
  shared->deps = std::move(deps);
  auto handle = sys.spawn(trainer, shared);
  auto exemplars = spawn_exemplar_actor(sys, xopt, {caf::actor_cast<group_sink_actor>(handle)});
  if (!exemplars.ok()) {
    caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
    return exemplars.error();
  }
  // Set before the handle is handed out, so before any message can reach the trainer (the
  // exemplar actor sends nothing before rollouts run).
  shared->exemplars = *exemplars;
  return caf::actor_cast<trainer_actor>(handle);
}

} // namespace crucible
