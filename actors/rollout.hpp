// actors/rollout.hpp: tasks from the run's pool in, scored variants out to the exemplar actor
// (which assembles complete GRPO groups for the learners). Per group: exemplars from the
// exemplar actor -> contrastive prompt (env/prompt) -> G completions from the engine actor ->
// parse (env/response_parser; format errors scored here) -> evaluator pool -> scored variants.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>

#include "actors/evaluator.hpp"
#include "actors/interfaces.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "env/prompt/feedback.hpp"
#include "env/prompt/prompt.hpp"
#include "env/prompt/response_parser.hpp"
#include "env/prompt/task_sampler.hpp"
#include "text/tokenizer.hpp"

namespace crucible {

/// Group and variant ids of rollout actor number `index` are index * 2^rollout_id_shift + n
/// (n = 1, 2, ...; index below 2^23, so every id is below 2^63).
inline constexpr int rollout_id_shift = 40;

/// Settings of one rollout actor. Value type; check with validate(). The `rollout:` config
/// section converts into it.
struct rollout_actor_options {
  std::uint32_t group_size = 4;            ///< G (≥ 1)
  /// Temperature, top-p, top-k, max_new_tokens and stop strings of every generation request;
  /// the seed is derived per group from `seed`, `index` and the group id.
  sampling_params sampling;
  std::uint64_t max_groups_in_flight = 2;  ///< groups under way at once (≥ 1)
  /// Turns of an episode (1 to 16): 1, each of the G completions is judged once; more, each is
  /// the first turn of an episode that gets its verdict as feedback and tries again.
  std::uint32_t turns = 1;
  double turn_stop_speedup = 0;            ///< an episode ends early at a correct turn this fast; 0: never
  task_sampling sampler = task_sampling::uniform;
  double sampler_mix = 0.1;                ///< uniform share under `improvement`, in [0, 1]
  std::string hardware;                    ///< kind (or device name) to evaluate on; "": the pool's first device
  double retry_s = 1.0;                    ///< delay before a refused request is sent again (> 0)
  in_flight_policy on_stop = in_flight_policy::finish;
  std::uint64_t max_groups = 0;            ///< tasks taken at most (0: until stopped)
  /// Async RL's staleness-aware admission (stages.rl.admission): the groups it may start before
  /// the trainer admits more (admit_atom), each group started (a reopened one included) taking
  /// one; a group it gives up on before it reaches the exemplar actor gives its admission back (one
  /// the exemplar actor drops at its straggler timeout is admitted again by the trainer).
  /// -1: no limit.
  std::int64_t admitted = -1;
  /// This actor's number among the run's rollout actors (< 2^23): the high bits of its group and
  /// variant ids (index * 2^40 + n, n = 1, 2, ...), so ids are unique across actors, and part of
  /// its seeds.
  std::uint64_t index = 0;
  std::uint64_t seed = 0;                  ///< the run's seed
  /// Text prompts are encoded with the tokenizer's template tokens (BOS): true when the prompt is
  /// plain text, false when a chat template rendered it (prompt_setup says which).
  bool add_special_tokens = false;
  /// A task sampler to continue (sampler_state::text, env::task_sampler::save): the records and
  /// generator of the rollout actor that held this place before a pause or a sync step's end.
  /// Empty: a fresh sampler seeded from `seed` and `index`.
  std::string saved_sampler;
  /// Groups of multi-turn episodes an earlier process left in flight, reopened at the exemplar
  /// actor (episode_resume): continued first, each episode at the turn it reached, and counted
  /// in max_groups.
  std::vector<episode_resume> resume;

  /// The `rollout:` section of `cfg` for rollout actor number `index`, `run.seed` as the seed.
  static rollout_actor_options from(const config& cfg, std::uint64_t index);

  /// errc::config naming the first bad key ("rollout.group_size", "rollout.turns", "rollout.max_groups_in_flight",
  /// "rollout.sampler_mix", "rollout.retry_s", "rollout.temperature", "rollout.top_p",
  /// "rollout.max_new_tokens") or the index.
  result<void> validate() const;
};

/// The prompt builder and parser settings of a run, made once and shared by its rollout actors.
struct prompt_setup {
  std::shared_ptr<const env::prompt_builder> builder; ///< thread-safe (const build)
  env::response_parse_options parse;                  ///< the template's sections, `prompt:` limits
  bool add_special_tokens = false;                    ///< see rollout_actor_options
  /// The feedback of multi-turn episodes (prompt.feedback_template); null when rollout.turns is 1.
  std::shared_ptr<const env::feedback_template> feedback;
};

/// The prompt template `prompt.template` names (env::resolve_prompt_template), the tokenizer's
/// chat template and special tokens (unless `prompt.chat_template: none`), prompts counted in
/// the tokenizer's tokens; with rollout.turns above 1 the feedback template too. Errors of
/// loading the templates or creating the builder.
result<prompt_setup> make_prompt_setup(const config& cfg, std::shared_ptr<const policy::tokenizer> tokenizer);

/// The task names of `tasks` in the order a rollout actor's sampler holds them (the catalogue's).
std::vector<std::string> sampler_pool(const task_catalog& tasks);

/// The task sampler of a rollout actor with options `opt` over `tasks`: `opt.sampler` and
/// `opt.sampler_mix`, seeded from `opt.seed` and `opt.index`, then continued from
/// `opt.saved_sampler` when it is not empty. Errors of env::task_sampler::create, and
/// errc::corrupt from restore when the saved state does not fit the pool.
result<env::task_sampler> make_task_sampler(const task_catalog& tasks, const rollout_actor_options& opt);

/// Whom a rollout actor works with.
struct rollout_deps {
  engine_actor engine;
  evaluator_pool_actor evaluators;
  exemplar_actor exemplars;
  std::shared_ptr<const task_catalog> tasks;          ///< the pool tasks are drawn from (not empty)
  std::shared_ptr<const env::prompt_builder> prompts;
  env::response_parse_options parse;
  reward_options reward;                              ///< the reward of a format error
  /// The feedback after each turn of an episode; needed when rollout_actor_options::turns > 1.
  std::shared_ptr<const env::feedback_template> feedback;
};

/// Spawns a rollout actor; it does nothing until it receives start.
///
/// A group goes through: exemplars for (task, hardware kind) -> the prompt (errors, e.g. a
/// reference too long for the budget, abandon the group) -> one generation_request of G samples
/// -> a group_announce of the G completions with fresh variant ids -> each completion parsed: a
/// format error is reported at once as a format_error verdict (reward `reward.format_error`),
/// the code of the others goes to the evaluator pool and its verdict is reported. Reports are
/// scored_variant messages to the exemplar actor, with the group id, the hardware kind, the
/// policy version of the completion and the ids of the exemplars the prompt showed.
///
/// With `turns` above 1 each member of a group is an episode (docs/training.md, "Multi-turn
/// episodes"). Once a turn's verdict is in, the episode goes on unless that was its last turn, or
/// the turn was correct at turn_stop_speedup or more, or the next prompt (the first prompt, then
/// each earlier answer as an assistant message and the feedback on its verdict as the next user
/// message, older turns shortened first: env::prompt_builder::continue_episode) does not fit the
/// budget: its scored variant says it `continues`, one generation request of one sample is made
/// for its next turn, and that completion goes to the exemplar actor as a group_extend before it
/// is evaluated. An episode waits only for its own verdicts; the group finishes with its last
/// episode. A next turn that cannot be generated ends its episode (a group_extend without a
/// variant releases its place).
///
/// Admission: with `admitted` at 0 or more, a group starts only while the actor holds an
/// admission (admitted, plus each admit_atom's count, less the groups it started); the trainer
/// admits one for each group that leaves its queue, so the groups ahead of the learner stay
/// within what its staleness bound trains (docs/training.md, "Staleness-aware admission").
///
/// Backpressure: at most max_groups_in_flight groups at once, so at most that many requests at
/// the engine and that many times G candidates at the evaluators; a request refused with
/// errc::busy (engine queue, evaluator queues, open groups at the exemplar actor) is sent again
/// after retry_s, holding its group's slot meanwhile. Another error abandons the group before
/// evaluation, or loses one member during it (counted in eval_errors and left to the exemplar
/// actor's straggler policy). The next task is taken when a group finishes, or after retry_s
/// when one was abandoned.
///
/// The actor monitors the engine, the pool and the exemplar actor and quits with the error
/// reason when one of them goes down (a stop waiting is answered first).
///
/// Every verdict it reports goes into its task sampler too (make_task_sampler). `save` replies
/// with the sampler's state, and so does `stop`, after the last group it finished: whoever holds
/// the state can hand it to the next rollout actor in `saved_sampler` (the trainer does, across
/// sync steps, stages and resumes).
///
/// errc::config from validate(); errc::invalid_arg for a missing collaborator or an empty task
/// catalogue; errc::corrupt when `opt.saved_sampler` does not fit the catalogue.
result<rollout_actor> spawn_rollout_actor(caf::actor_system& sys, rollout_deps deps, rollout_actor_options opt);

/// Spawns the run's `rollout.actors` rollout actors, numbered 0, 1, ..., with options from
/// `cfg` (rollout_actor_options::from) and `add_special_tokens` from the prompt setup, all
/// sharing `deps`. The first error stops the spawning (actors already spawned are told to exit).
result<std::vector<rollout_actor>> spawn_rollout_actors(caf::actor_system& sys, const rollout_deps& deps,
                                                        const config& cfg, bool add_special_tokens);

} // namespace crucible
