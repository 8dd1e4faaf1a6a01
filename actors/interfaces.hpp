// actors/interfaces.hpp: the typed interface of every actor role (DESIGN §1), one comment per
// handler. Messages and atoms come from actors/messages.hpp.
//
// In this build the coordinator, the evaluators, the exemplar actor, the engine, the rollout
// actors, the learners and membership have implementations (actors/coordinator.hpp,
// evaluator.hpp, exemplar.hpp, engine.hpp, rollout.hpp, learner.hpp, membership.hpp). Tests
// substitute fakes that implement the same interfaces.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/messages.hpp"

namespace crucible {

/// Owns the run: stage schedule, counters, pause and resume (DESIGN §1.5).
using coordinator_actor = caf::typed_actor<
  // Starts the run and advances through the stage schedule; replies with the status at
  // which advancing stopped (finished, paused or crashed). An error if already started.
  caf::replies_to<start_atom>::with<run_status>,
  // The current status (the same snapshot status.json holds).
  caf::replies_to<caf::get_atom>::with<run_status>,
  // Pauses a running run; a no-op reply in any other state.
  caf::replies_to<pause_atom>::with<run_status>,
  // Resumes a paused run; replies like start. A no-op reply in any other state.
  caf::replies_to<resume_atom>::with<run_status>,
  // Graceful shutdown: a running run is paused, metrics are synced, the actor quits after
  // replying with the last status.
  caf::replies_to<stop_atom>::with<run_status>>;

/// The coordinator as implemented: its public interface plus the message it sends itself to
/// move to the next stage, so that status, pause and stop are served between stages. Only
/// spawn_coordinator hands this handle out; everybody else holds a coordinator_actor.
using coordinator_impl_actor = coordinator_actor::extend<
  // Runs the next stage of the schedule, or finishes the run when none is left.
  caf::reacts_to<advance_atom>,
  // Publishes a heartbeat (the status) and schedules the next one while the run is live.
  caf::reacts_to<heartbeat_atom>,
  // A pause has waited run.pause_grace_s for the step under way (the number counts pauses, so
  // that a late reminder of an earlier one is ignored).
  caf::reacts_to<drain_atom, std::uint64_t>>;

/// Turns tasks into scored GRPO groups in a loop: task -> exemplars -> contrastive prompt ->
/// G completions -> parse -> evaluators -> scored variants to the exemplar actor, which
/// assembles the groups for the learners (DESIGN §1.1-1.4; actors/rollout.hpp).
using rollout_actor = caf::typed_actor<
  // Starts the loop (a no-op when it runs): up to rollout.max_groups_in_flight groups at once,
  // a new task taken whenever one finishes.
  caf::reacts_to<start_atom>,
  // Takes no new task, finishes or drops the groups in flight (rollout.on_stop), then replies
  // with the final counters and its task sampler's state (the verdicts of the finished groups
  // observed), and quits.
  caf::replies_to<stop_atom>::with<rollout_stats, sampler_state>,
  // As stop_atom, but drops the groups in flight whatever rollout.on_stop says, and has the
  // engine drop this actor's requests still waiting (cancel_atom): for a stop whose groups
  // would be discarded anyway (a stage change, run.on_pause: drop).
  caf::replies_to<stop_atom, cancel_atom>::with<rollout_stats, sampler_state>,
  // Admits `n` more groups (async RL's staleness-aware admission: the trainer admits one for each
  // group that leaves its queue); ignored by an actor spawned without an admission limit.
  caf::reacts_to<admit_atom, std::uint64_t>,
  // The counters.
  caf::replies_to<caf::get_atom>::with<rollout_stats>,
  // Its task sampler's state now, for a checkpoint taken while it runs.
  caf::replies_to<save_atom>::with<sampler_state>>;

/// The rollout actor as implemented: its interface plus the messages it sends itself.
/// Internal to actors/rollout.cpp; spawn_rollout_actor hands out only the rollout_actor part.
using rollout_impl_actor = rollout_actor::extend<
  // Starts groups up to the in-flight bound (after a delay, when the last attempt failed).
  caf::reacts_to<advance_atom>,
  // Sends group `group`'s refused request again: member `slot`'s candidate, or the group's
  // own step (generation, announce) for slot == no slot (UINT32_MAX).
  caf::reacts_to<retry_atom, std::uint64_t, std::uint32_t>>;

/// Samples completions with the current policy on its device (DESIGN §1.2, §5;
/// actors/engine.hpp).
using engine_actor = caf::typed_actor<
  // Samples `samples` completions of the prompt, with behaviour log-probs and the version that
  // sampled them. Waiting requests with equal sampling settings share an engine call.
  // errc::busy when the queue is full (backpressure); errc::invalid_arg for an empty or too
  // long prompt or bad settings.
  caf::replies_to<generation_request>::with<generation_result>,
  // The sender's requests still waiting (not those of the call under way) are dropped, each
  // answered errc::cancelled: a rollout that stops and drops its groups frees the engine for the
  // next stage's instead of leaving it to sample what nobody will read.
  caf::reacts_to<cancel_atom>,
  // Serves the weights of a model directory as the given version from the next engine call
  // on; errc::invalid_arg for a version below the one served or another vocabulary.
  caf::replies_to<weight_update>::with<policy_version>,
  // Receives the announced weights through the engine's weight receiver (an NCCL broadcast);
  // replies with the version now served. errc::unsupported when it has none.
  caf::replies_to<weights_published>::with<policy_version>,
  // The version served and the queue counters.
  caf::replies_to<caf::get_atom>::with<engine_status>>;

/// Runs an engine actor's engine calls and weight loads, one at a time, on a detached thread
/// (a call blocks for seconds). Internal to actors/engine.cpp.
using engine_runner_actor = caf::typed_actor<
  // One engine call for every request of the batch; per-request errors in the result.
  caf::replies_to<generation_batch>::with<generation_batch_result>,
  // As engine_actor's.
  caf::replies_to<weight_update>::with<policy_version>,
  // As engine_actor's.
  caf::replies_to<weights_published>::with<policy_version>>;

/// Owns one device exclusively and judges candidates in sandboxed workers (DESIGN §4).
using evaluator_actor = caf::typed_actor<
  // Verifies, times and checks one candidate; untrusted outcomes are verdict values, an
  // error only for infrastructure failure.
  caf::replies_to<candidate>::with<verdict>,
  // The device this evaluator owns.
  caf::replies_to<caf::get_atom>::with<device_info>>;

/// Runs evaluations for an evaluator, one at a time, on a detached thread (an evaluation
/// blocks for seconds). Internal to actors/evaluator.cpp.
using evaluation_runner_actor = caf::typed_actor<
  // Evaluates one candidate synchronously; errc::not_found for a task the run does not know.
  caf::replies_to<candidate>::with<verdict>>;

/// Spreads candidates over the evaluators of every device (DESIGN §1.3, §6).
using evaluator_pool_actor = caf::typed_actor<
  // Evaluates on the evaluator of the wanted hardware kind with the shortest queue;
  // errc::busy when every queue is full (backpressure), errc::not_found when no evaluator
  // has that hardware kind. A candidate whose evaluator dies or is removed is sent to another.
  caf::replies_to<candidate>::with<verdict>,
  // The devices behind the pool, with their hardware kinds; while an added evaluator has not yet
  // said what device it is, the reply waits for it (or for its removal).
  caf::replies_to<caf::get_atom>::with<std::vector<device_info>>,
  // Adds evaluators (evaluator_actor handles, local or remote) to the running pool; the pool
  // asks each for its device and monitors it. Handles already in the pool are ignored.
  caf::reacts_to<caf::add_atom, std::vector<caf::actor>>,
  // Removes evaluators (a node left or stopped answering): their candidates in flight go back
  // to the head of the queue, as when an evaluator dies; verdicts they send later are ignored.
  caf::reacts_to<caf::delete_atom, std::vector<caf::actor>>>;

/// The replay store of scored variants, per task and hardware kind, and the assembly of
/// complete GRPO groups for the learners (DESIGN §1.1, §1.4).
using exemplar_actor = caf::typed_actor<
  // Chooses up to `count` (0: the configured default) prior successful variants of the task
  // on that hardware kind for a contrastive prompt; an empty set when there are none.
  caf::replies_to<exemplar_request>::with<exemplar_set>,
  // Opens a GRPO group whose scored variants will follow; errc::busy when too many groups are
  // open (backpressure), errc::invalid_arg for a malformed announce or a group already open.
  caf::reacts_to<group_announce>,
  // Stores a scored variant as a future exemplar and fills its slot in its open group; a
  // complete group goes to a learner. Duplicates and verdicts for no open group are counted.
  caf::reacts_to<scored_variant>,
  // The next turn of an episode of an open group (after its episode's scored variant with
  // `continues`); counted as unknown when the group is no longer open.
  caf::reacts_to<group_extend>,
  // The counters: recorded, groups completed, filled, dropped, refused, duplicates, ...
  caf::replies_to<caf::get_atom>::with<exemplar_stats>,
  // Sets the fate of the samples of groups the trainer took (trained, stale, discarded, paused).
  caf::reacts_to<sample_fates>,
  // Settles the store's samples (replay_store::settle_samples; `kept_seq` < 0: none) and forgets
  // the open groups, whose later verdicts are orphans; replies how many samples it marked
  // unfinished. Sent when the rollouts have stopped, and at the start of a resumed run.
  caf::replies_to<settle_atom, std::int64_t>::with<std::int64_t>,
  // Reopens the groups of multi-turn episodes that earlier processes left unfinished, whose
  // samples were all sampled at policy versions in [min, max] (replay_store::reopen_episode_groups),
  // at most `limit` of them (0: none, only the largest group id): each is open again, waiting
  // for the turns its episodes have still to take, and comes back for a rollout actor to
  // continue. Sent once, after the settle, before a process's first sampling step.
  caf::replies_to<reopen_atom, std::uint64_t, std::uint64_t, std::uint64_t>::with<episode_reopening>>;

/// The exemplar actor as implemented: its public interface plus the straggler timeout it
/// sends itself per group. Internal to actors/exemplar.cpp; spawn_exemplar_actor hands out
/// only the exemplar_actor part.
using exemplar_impl_actor = exemplar_actor::extend<
  // The straggler timeout of group `group` (announce number `seq`) has passed.
  caf::reacts_to<expire_atom, group_id, std::uint64_t>>;

/// Where complete GRPO groups go (the trainer; tests' stand-ins).
using group_sink_actor = caf::typed_actor<
  // Takes one complete group.
  caf::reacts_to<rollout_group>,
  // A group dropped at its straggler timeout, which will never come.
  caf::reacts_to<group_dropped>>;

/// One data-parallel rank of GRPO/SFT training on one device, gradients all-reduced over its
/// communicator (DESIGN §1.4, §5; actors/learner.hpp). Runs detached. Every rank of a group must
/// get the same sequence of update requests (train, learner_batch, sft_batch, save).
using learner_actor = caf::typed_actor<
  // Queues a complete group for the next train_atom update (the exemplar actor deals groups to
  // the ranks round robin).
  caf::reacts_to<rollout_group>,
  // One update over the queued groups (stale ones dropped and counted); rank 0 then publishes
  // the new weights to the engines. Errors (a refused batch, a collective timeout) come back as
  // errors with the learner's message.
  caf::replies_to<train_atom>::with<train_report>,
  // One update on this rank's share of a global batch (groups rank, rank + W, ...); as train.
  caf::replies_to<learner_batch>::with<train_report>,
  // One SFT update on this rank's share of the examples; as train.
  caf::replies_to<sft_batch>::with<train_report>,
  // Starts the optimiser's moments afresh for a new training stage (policy::learner::
  // reset_moments); the updates after it use them. Every rank must get it, like the batches.
  caf::reacts_to<reset_atom>,
  // Writes the learner's checkpoint into the directory (policy/training/checkpoint.hpp;
  // collective); replies with its version.
  caf::replies_to<save_atom, std::string>::with<policy_version>>;

/// Runs a run's stage schedule one step at a time for the coordinator (actors/trainer.hpp).
using trainer_actor = caf::typed_actor<
  // Runs the next step of the schedule; the report says what it did and whether the schedule
  // is complete.
  caf::replies_to<advance_atom>::with<stage_report>,
  // Stops the rollout actors (finishing or dropping their groups per run.on_pause); the report
  // carries the verdicts that arrived meanwhile.
  caf::replies_to<stop_atom>::with<stage_report>,
  // Writes a checkpoint (learner, schedule position and the rollouts' task samplers); replies
  // with its directory.
  caf::replies_to<save_atom>::with<std::string>,
  // Ends the step under way without training when it only waits for groups (a pause that
  // waited run.pause_grace_s for it); replies with what it did, or why the step goes on.
  caf::replies_to<drain_atom>::with<std::string>,
  // A complete group from the exemplar actor.
  caf::reacts_to<rollout_group>,
  // A group the exemplar actor dropped at its straggler timeout: another is admitted in its place.
  caf::reacts_to<group_dropped>>;

/// The trainer as implemented: its interface plus the timer it sends itself while a step waits
/// (for groups, or for warm-start candidates refused as busy). Internal to actors/trainer.cpp.
using trainer_impl_actor = trainer_actor::extend<
  caf::reacts_to<collect_atom>,
  // A step's wait for groups (its number) checked for silence: the groups seen when it was armed.
  caf::reacts_to<stall_atom, std::uint64_t, std::uint64_t>>;

/// Admits nodes that join with the run's token, adds their evaluators to the pool and removes
/// them again when they leave, disconnect or stop sending heartbeats (DESIGN §6;
/// actors/membership.hpp). Published on the network: joining needs the token, and a node's
/// heartbeats and leave are taken only from the agent that announced it.
using membership_actor = caf::typed_actor<
  // The run's task sources and configuration for a node about to join; errc::refused for a
  // wrong token.
  caf::replies_to<tasks_request>::with<run_setup>,
  // Admits a node with the right token (errc::refused otherwise, and nothing is added), adds its
  // evaluators to the pool, monitors the sender as the node's agent and expects its heartbeats.
  caf::replies_to<node_announce>::with<node_welcome>,
  // A heartbeat from the agent of an admitted node; errc::not_found when the node is not (or no
  // longer) a member or the sender is not its agent.
  caf::reacts_to<heartbeat_atom, node_id>,
  // The node's agent leaves in an orderly way: its evaluators leave the pool (their in-flight
  // candidates are re-queued) before the (empty) answer; errc::not_found as for a heartbeat.
  caf::reacts_to<caf::leave_atom, node_id>,
  // The nodes currently admitted: host, role and devices (tokens and handles left out).
  caf::replies_to<caf::get_atom>::with<std::vector<node_announce>>>;

/// The membership actor as implemented: its interface plus the check it sends itself.
/// Internal to actors/membership.cpp.
using membership_impl_actor = membership_actor::extend<
  // Removes every node whose last heartbeat is older than the timeout; schedules the next check.
  caf::reacts_to<expire_atom>>;

/// A joined node's side of membership (actors/membership.hpp): announces the node, keeps its
/// heartbeat and leaves. It quits with an error when the coordinator goes away, stops
/// answering or no longer knows the node, and normally after a leave.
using node_agent_actor = caf::typed_actor<
  // Announces the node to the membership actor; replies with the welcome (or the refusal) and
  // from then on sends heartbeats at the welcome's interval.
  caf::replies_to<caf::join_atom>::with<node_welcome>,
  // Leaves: tells the membership actor, waits for its answer (at most the heartbeat timeout),
  // then quits normally.
  caf::reacts_to<caf::leave_atom>>;

/// The node agent as implemented: its interface plus the tick it sends itself.
/// Internal to actors/membership.cpp.
using node_agent_impl_actor = node_agent_actor::extend<
  // Sends the next heartbeat.
  caf::reacts_to<heartbeat_atom>>;

} // namespace crucible
