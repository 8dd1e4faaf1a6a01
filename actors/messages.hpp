// actors/messages.hpp: every message the actors exchange, their inspect() functions, the
// atoms (verbs) of the typed interfaces and the project's single CAF type-ID block.
//
// CAF 0.17 rules this file follows (see STYLE.md):
//  - every struct that travels in a message is default- and copy-constructible, has an
//    inspect() below and an entry in the `crucible` type-ID block at the end of this file;
//    tests/actors/test_messages.cpp round-trips every entry of that block;
//  - no std::optional / std::variant: "no value" is a flag or NaN; every double travels as its
//    bit pattern (detail::exact), because CAF 0.17's portable float encoding (pack754) garbles
//    NaN and never returns for infinity (a NaN loss or an infinite speedup can happen);
//  - enums travel as their underlying integer (CAF 0.17's data_processor does this for any
//    enum without a serialize() overload; an inspect() overload for an enum would make that
//    overload ambiguous), and the inspect() of the struct that holds one rejects out-of-range
//    values on load;
//  - types of the layers below (env::verdict) are messages as they are: their inspect() is
//    here, in their own namespace for ADL, because env/ does not include CAF;
//  - atoms are verbs of at most 10 characters.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/deserializer.hpp>
#include <caf/error.hpp>
#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>
#include <caf/type_id.hpp>

#include "core/error.hpp"
#include "core/ids.hpp"
#include "core/json.hpp"
#include "env/verdict.hpp"

namespace crucible {

// -- core id types --------------------------------------------------------------------------

/// Inspects any strong_id (task_id, variant_id, group_id, policy_version, node_id) as its
/// underlying value.
template <class Inspector, class Tag, class T>
typename Inspector::result_type inspect(Inspector& f, strong_id<Tag, T>& x) {
  return f(caf::meta::type_name("strong_id"), x.value);
}

// -- enums ----------------------------------------------------------------------------------

/// Outcome of evaluating one candidate (DESIGN §3 verdict `status`, plus `format_error` for
/// a completion from which no candidate code could be extracted). to_string, parse and
/// is_valid come with it from env/verdict.hpp.
using verdict_status = env::verdict_status;

/// Lifecycle of a run as status.json reports it.
enum class run_state : std::uint8_t { starting, running, pausing, paused, finished, crashed };

/// What a node joining the cluster contributes.
enum class node_role : std::uint8_t { evaluator, engine, learner };

/// "starting", "running", ...
const char* to_string(run_state x) noexcept;
/// "evaluator", "engine", "learner".
const char* to_string(node_role x) noexcept;

/// Inverse of to_string; nullopt for any other text.
std::optional<run_state> parse_run_state(std::string_view text) noexcept;
/// Inverse of to_string; nullopt for any other text.
std::optional<node_role> parse_node_role(std::string_view text) noexcept;

/// True if `x` is one of the enumerators (a value loaded from the wire may not be).
constexpr bool is_valid(run_state x) noexcept {
  return static_cast<std::uint8_t>(x) <= static_cast<std::uint8_t>(run_state::crashed);
}
/// True if `x` is one of the enumerators.
constexpr bool is_valid(node_role x) noexcept {
  return static_cast<std::uint8_t>(x) <= static_cast<std::uint8_t>(node_role::learner);
}

namespace detail {

/// A load callback that fails deserialization when `e` holds no enumerator.
template <class Enum>
auto check_enum(const Enum& e) {
  return caf::meta::load_callback([&e]() -> caf::error {
    if (is_valid(e))
      return caf::none;
    return caf::make_error(caf::sec::invalid_argument);
  });
}

/// A double field inspected through its IEEE 754 bit pattern, so that NaN ("no value") and
/// infinity survive a round trip (CAF 0.17's float encoding does not). Wraps a reference for
/// the duration of one inspect() call: `f(..., exact{x.speedup}, ...)`.
struct exact {
  double& x;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exact& d) {
  static_assert(std::numeric_limits<double>::is_iec559 && sizeof(double) == sizeof(std::uint64_t));
  if constexpr (std::is_base_of_v<caf::serializer, Inspector>) {
    auto bits = std::bit_cast<std::uint64_t>(d.x);
    return f(bits);
  } else if constexpr (std::is_base_of_v<caf::deserializer, Inspector>) {
    std::uint64_t bits = 0;
    auto err = f(bits);
    if (!err)
      d.x = std::bit_cast<double>(bits);
    return err;
  } else {
    return f(d.x); // printing (deep_to_string): the number itself
  }
}

} // namespace detail

// -- generation (rollout -> engine -> rollout) -----------------------------------------------

/// Sampling settings of one generation request. Value type.
struct sampling_params {
  double temperature = 1.0;
  double top_p = 1.0;
  std::int32_t top_k = 0;              ///< 0: no top-k filter
  std::uint32_t max_new_tokens = 1024;
  std::vector<std::string> stop;       ///< stop strings, not included in the completion
  std::uint64_t seed = 0;

  friend bool operator==(const sampling_params&, const sampling_params&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampling_params& x) {
  return f(caf::meta::type_name("sampling_params"), detail::exact{x.temperature}, detail::exact{x.top_p}, x.top_k,
           x.max_new_tokens, x.stop, x.seed);
}

/// One message of a chat, for an engine that applies its own chat template (an endpoint).
struct chat_turn {
  std::string role; ///< "system", "user", "assistant"
  std::string content;

  friend bool operator==(const chat_turn&, const chat_turn&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chat_turn& x) {
  return f(caf::meta::type_name("chat_turn"), x.role, x.content);
}

/// Rollout -> engine: sample `samples` completions (one GRPO group) of one prompt.
struct generation_request {
  group_id group;
  task_id task;
  std::string prompt;       ///< the full prompt text (chat template applied); encoded by the engine
  /// The prompt as token ids; when not empty it is sampled on as is and `prompt` is not encoded.
  std::vector<std::int32_t> prompt_token_ids;
  /// Encode `prompt` with the tokens the tokenizer's post-processor adds (e.g. Llama's BOS).
  /// False for text rendered with a chat template, which writes its own.
  bool add_special_tokens = false;
  std::uint32_t samples = 0; ///< G, the group size
  sampling_params params;
  /// The same prompt as chat messages (system, user) before any template: what an engine behind an
  /// OpenAI-compatible endpoint sends (policy.backend openai). The local engine samples `prompt`.
  std::vector<chat_turn> messages;

  friend bool operator==(const generation_request&, const generation_request&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation_request& x) {
  return f(caf::meta::type_name("generation_request"), x.group, x.task, x.prompt, x.prompt_token_ids,
           x.add_special_tokens, x.samples, x.params, x.messages);
}

/// One sampled completion with its behaviour log-probabilities.
struct completion {
  std::string text;
  std::vector<std::int32_t> token_ids;  ///< generated tokens only (no prompt)
  std::vector<float> logprobs;          ///< one per token id, under the sampling policy
  crucible::policy_version policy_version; ///< weights that sampled it

  friend bool operator==(const completion&, const completion&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, completion& x) {
  return f(caf::meta::type_name("completion"), x.text, x.token_ids, x.logprobs,
           x.policy_version);
}

/// Engine -> rollout: the group of completions for one generation_request.
struct generation_result {
  group_id group;
  task_id task;
  std::vector<std::int32_t> prompt_token_ids; ///< the prompt as the engine tokenized it
  std::vector<completion> completions;

  friend bool operator==(const generation_result&, const generation_result&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation_result& x) {
  return f(caf::meta::type_name("generation_result"), x.group, x.task, x.prompt_token_ids,
           x.completions);
}

/// Engine actor -> its runner: waiting requests sampled in one engine call (equal sampling
/// settings; the seed of the first is the call's).
struct generation_batch {
  std::vector<generation_request> requests;

  friend bool operator==(const generation_batch&, const generation_batch&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation_batch& x) {
  return f(caf::meta::type_name("generation_batch"), x.requests);
}

/// Runner -> engine actor: for request i of a generation_batch, results[i] when errors[i] is
/// empty, else the error that refused it (its results[i] is empty).
struct generation_batch_result {
  std::vector<generation_result> results;
  std::vector<caf::error> errors;

  friend bool operator==(const generation_batch_result&, const generation_batch_result&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation_batch_result& x) {
  return f(caf::meta::type_name("generation_batch_result"), x.results, x.errors);
}

/// To an engine: serve the weights of the Hugging Face model directory `model_dir` (same
/// vocabulary as the served model) as `policy_version` from the next engine call on.
struct weight_update {
  std::string model_dir;
  crucible::policy_version policy_version;

  friend bool operator==(const weight_update&, const weight_update&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, weight_update& x) {
  return f(caf::meta::type_name("weight_update"), x.model_dir, x.policy_version);
}

/// Engine actor -> anyone who asks: the version served and its queue counters since it started.
struct engine_status {
  crucible::policy_version policy_version; ///< stamped on completions of the next call
  std::uint64_t queued = 0;         ///< requests waiting now
  std::uint64_t running = 0;        ///< requests in the engine call under way
  std::uint64_t requests = 0;       ///< requests answered with completions
  std::uint64_t failed = 0;         ///< requests answered with an error (bad prompt, engine failure)
  std::uint64_t refused = 0;        ///< requests refused as busy (queue full)
  std::uint64_t batches = 0;        ///< engine calls made
  std::uint64_t samples = 0;        ///< completions returned
  std::uint64_t weight_updates = 0; ///< weights loaded or received
  std::uint64_t cancelled = 0;      ///< waiting requests dropped because their sender cancelled them

  friend bool operator==(const engine_status&, const engine_status&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_status& x) {
  return f(caf::meta::type_name("engine_status"), x.policy_version, x.queued, x.running, x.requests,
           x.failed, x.refused, x.batches, x.samples, x.weight_updates, x.cancelled);
}

// -- evaluation (rollout -> evaluator -> rollout) --------------------------------------------

/// Rollout -> evaluator: one candidate source (DESIGN §3 "Candidate") to verify and time.
struct candidate {
  variant_id variant;
  task_id task;
  std::string code;     ///< Python source defining ModelNew
  std::string hardware; ///< hardware kind wanted (e.g. "NVIDIA H100"); empty: any
  /// A second measurement of a large speedup (the pool's cross-device recheck): evaluated
  /// without reading the verdict cache, and never itself rechecked.
  bool recheck = false;
  /// No candidate: the task's reference is built and run once (device_evaluator::check_task),
  /// the check a run makes of every task before its first step. `code` is ignored.
  bool reference_only = false;

  friend bool operator==(const candidate&, const candidate&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, candidate& x) {
  return f(caf::meta::type_name("candidate"), x.variant, x.task, x.code, x.hardware, x.recheck, x.reference_only);
}

} // namespace crucible

namespace crucible::env {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kernel_share& x) {
  return f(caf::meta::type_name("kernel_share"), x.name, crucible::detail::exact{x.share});
}

/// A reference's counted work (env/verdict.hpp), inside a verdict.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, task_work& x) {
  using crucible::detail::exact;
  return f(caf::meta::type_name("task_work"), x.flops, exact{x.bytes_read}, exact{x.bytes_written});
}

/// A task's bound on the verdict's hardware (env/verdict.hpp), inside a verdict.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, task_bound& x) {
  using crucible::detail::exact;
  return f(caf::meta::type_name("task_bound"), exact{x.ms}, exact{x.bytes_ms}, exact{x.flops_ms});
}

/// The verdict (env/verdict.hpp) as a message: every field, numbers bit-exact (NaN speedups
/// of failed verdicts included); a status outside the enum is rejected on load.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, verdict& x) {
  using crucible::detail::exact;
  return f(caf::meta::type_name("verdict"), x.status, x.correct, exact{x.speedup}, exact{x.speedup_spread},
           exact{x.ref_ms}, exact{x.cand_ms}, exact{x.reward}, x.checks_failed, x.message, x.hardware,
           x.cache_hit, x.rounds, exact{x.wall_s}, x.baseline, x.profile, exact{x.own_share},
           x.precision_reference, x.precision_candidate, x.judged, x.work, x.bound, crucible::detail::check_enum(x.status));
}

} // namespace crucible::env

namespace crucible {

/// Evaluator -> rollout: the verdict of DESIGN §3 (env/verdict.hpp), field by field.
using verdict = env::verdict;

/// A candidate with its verdict: rollout -> exemplar actor (a future exemplar, and one member
/// of its GRPO group). In an exemplar_set, `variant` is the replay store's row id, the id that
/// later records name among their `exemplars`.
struct scored_variant {
  variant_id variant;
  group_id group;           ///< the GRPO group it belongs to; 0: none
  task_id task;
  std::string code;
  crucible::verdict verdict;
  std::string hardware;     ///< hardware kind it was evaluated on (e.g. "h100"), not the device model
  crucible::policy_version policy_version; ///< weights that generated it
  std::vector<variant_id> exemplars;       ///< exemplars its prompt showed (replay store ids)
  /// The full prompt text the policy saw (chat template applied); empty for a seed variant, and
  /// in exemplar sets (the store keeps it once, by its hash).
  std::string prompt;
  /// The policy's whole response the code was cut from (the code itself for a format error);
  /// empty for a seed variant, and in exemplar sets.
  std::string completion;
  /// Its place in a multi-turn episode (rollout.turns > 1): the episode's number in its group
  /// and the turn (from 0). 0 and 0 for a variant of a one-turn group.
  std::uint32_t episode = 0;
  std::uint32_t turn = 0;
  /// Its episode goes on: a group_extend with the next turn will follow, and the group waits
  /// for it (the exemplar actor holds one more place open).
  bool continues = false;

  friend bool operator==(const scored_variant&, const scored_variant&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, scored_variant& x) {
  return f(caf::meta::type_name("scored_variant"), x.variant, x.group, x.task, x.code,
           x.verdict, x.hardware, x.policy_version, x.exemplars, x.prompt, x.completion, x.episode, x.turn,
           x.continues);
}

// -- exemplars (rollout <-> exemplar actor) --------------------------------------------------

/// Rollout -> exemplar actor: up to `count` prior variants of `task` for a contrastive prompt.
struct exemplar_request {
  task_id task;
  std::string hardware;   ///< exemplars are kept per hardware kind
  std::uint32_t count = 0;

  friend bool operator==(const exemplar_request&, const exemplar_request&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exemplar_request& x) {
  return f(caf::meta::type_name("exemplar_request"), x.task, x.hardware, x.count);
}

/// Exemplar actor -> rollout: the chosen exemplars with their measured speedups.
struct exemplar_set {
  task_id task;
  std::string hardware;
  std::vector<scored_variant> exemplars;

  friend bool operator==(const exemplar_set&, const exemplar_set&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exemplar_set& x) {
  return f(caf::meta::type_name("exemplar_set"), x.task, x.hardware, x.exemplars);
}

// -- learning (rollout -> learner -> engines) ------------------------------------------------

/// Rollout -> learner: a complete GRPO group, completions[i] scored by verdicts[i]. A group of
/// multi-turn episodes (rollout.turns > 1) lists every turn of every episode: completions[i] is
/// turn turns[i] of episode episodes[i], sampled after contexts[i] (the prompt and the earlier
/// turns with their feedback, as the engine was given them); the learner makes each turn a row
/// with its turn-level advantage (policy/training/episode_batch.hpp). The three are empty for a
/// group of one turn, whose completions all follow prompt_token_ids.
struct rollout_group {
  group_id group;
  task_id task;
  std::vector<std::int32_t> prompt_token_ids;
  std::vector<completion> completions;
  std::vector<verdict> verdicts; ///< same length and order as completions
  std::vector<std::uint32_t> episodes;                ///< empty, or one per completion
  std::vector<std::uint32_t> turns;                   ///< empty, or one per completion
  std::vector<std::vector<std::int32_t>> contexts;    ///< empty, or one per completion

  /// Whether this is a group of multi-turn episodes.
  bool multi_turn() const noexcept { return !turns.empty(); }

  friend bool operator==(const rollout_group&, const rollout_group&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_group& x) {
  return f(caf::meta::type_name("rollout_group"), x.group, x.task, x.prompt_token_ids,
           x.completions, x.verdicts, x.episodes, x.turns, x.contexts);
}

/// Rollout -> exemplar actor: a GRPO group whose G = completions.size() scored variants will
/// follow one by one; variants[i] is the variant id of the candidate cut from completions[i].
/// The exemplar actor sends the complete group on to a learner (DESIGN §1.4).
struct group_announce {
  group_id group; ///< not 0 (0 marks a scored variant that belongs to no group)
  task_id task;
  std::vector<std::int32_t> prompt_token_ids;
  std::vector<completion> completions;
  std::vector<variant_id> variants; ///< same length and order as completions; distinct
  /// The turns an episode may take (rollout.turns): 1, a group of one turn; more, completions[i]
  /// is turn 0 of episode i and later turns follow as group_extend.
  std::uint32_t turns = 1;
  /// With turns above 1: the first prompt every later turn continues (its system and user
  /// messages and its text) and the exemplars it showed, stored so that a later process can
  /// continue the group's episodes (replay_store::record_episode_group). Empty otherwise.
  std::string system, user, prompt;
  std::vector<variant_id> exemplars;

  friend bool operator==(const group_announce&, const group_announce&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, group_announce& x) {
  return f(caf::meta::type_name("group_announce"), x.group, x.task, x.prompt_token_ids,
           x.completions, x.variants, x.turns, x.system, x.user, x.prompt, x.exemplars);
}

/// Rollout -> exemplar actor: the next turn of episode `episode` of an open group, whose scored
/// variant will follow; it fills the place that the episode's last scored variant (`continues`)
/// held open. Sent after that scored variant and before this turn's. Variant 0: the turn could
/// not be sampled, the episode ends, and its place is released.
struct group_extend {
  group_id group;
  variant_id variant;
  std::uint32_t episode = 0;
  std::uint32_t turn = 0;                      ///< from 1
  std::vector<std::int32_t> prompt_token_ids;  ///< the turn's context as the engine was given it
  completion sampled;

  friend bool operator==(const group_extend&, const group_extend&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, group_extend& x) {
  return f(caf::meta::type_name("group_extend"), x.group, x.variant, x.episode, x.turn, x.prompt_token_ids,
           x.sampled);
}

/// One turn of an episode that an earlier process sampled and evaluated, as a group reopened
/// to be continued holds it (replay_store::reopen_episode_groups).
struct stored_turn {
  std::uint32_t episode = 0;
  std::uint32_t turn = 0;
  completion sampled;                   ///< text, tokens, log-probs and the weights that sampled it
  std::vector<std::int32_t> context;    ///< the tokens it was sampled after (turn 0: the group's prompt)
  crucible::verdict verdict;
  bool continues = false;               ///< its episode went on after it

  friend bool operator==(const stored_turn&, const stored_turn&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stored_turn& x) {
  return f(caf::meta::type_name("stored_turn"), x.episode, x.turn, x.sampled, x.context, x.verdict, x.continues);
}

/// A group of multi-turn episodes an earlier process left in flight (a crash, or a pause that
/// dropped it), reopened by the exemplar actor and continued by a rollout actor at the turn
/// each episode reached: an episode whose last stored turn `continues` gets its next turn, one
/// with no stored turn gets its first, and the others have ended.
struct episode_resume {
  group_id group;
  task_id task;
  std::uint32_t turns = 0;     ///< rollout.turns of the run that sampled it
  std::uint32_t episodes = 0;  ///< G
  std::string system, user, prompt; ///< the first prompt (group_announce's)
  std::vector<variant_id> exemplars;
  std::vector<std::int32_t> prompt_token_ids;
  std::vector<stored_turn> stored;  ///< by episode, then turn

  friend bool operator==(const episode_resume&, const episode_resume&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, episode_resume& x) {
  return f(caf::meta::type_name("episode_resume"), x.group, x.task, x.turns, x.episodes, x.system, x.user, x.prompt,
           x.exemplars, x.prompt_token_ids, x.stored);
}

/// Exemplar actor -> trainer: the groups it reopened (reopen_atom), how many stored samples
/// they hold (undecided again), and the largest group id the store has seen, above which the
/// new process numbers its groups.
struct episode_reopening {
  std::vector<episode_resume> groups;
  std::int64_t samples = 0;
  std::uint64_t max_group = 0;

  friend bool operator==(const episode_reopening&, const episode_reopening&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, episode_reopening& x) {
  return f(caf::meta::type_name("episode_reopening"), x.groups, x.samples, x.max_group);
}

/// Exemplar actor -> anyone who asks: its counters since it started.
struct exemplar_stats {
  std::uint64_t recorded = 0;         ///< scored variants written to the replay store
  std::uint64_t record_errors = 0;    ///< scored variants the store failed to write
  std::uint64_t groups_completed = 0; ///< groups sent on with every verdict in
  std::uint64_t groups_filled = 0;    ///< groups sent on after the straggler timeout, gaps filled
  std::uint64_t groups_dropped = 0;   ///< groups discarded after the straggler timeout
  std::uint64_t groups_refused = 0;   ///< announces answered with errc::busy
  std::uint64_t duplicates = 0;       ///< verdicts for a group member that already had one
  std::uint64_t unknown = 0;          ///< verdicts for a group not open, or not a member of it
  std::uint64_t open_groups = 0;      ///< groups waiting for verdicts now

  friend bool operator==(const exemplar_stats&, const exemplar_stats&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exemplar_stats& x) {
  return f(caf::meta::type_name("exemplar_stats"), x.recorded, x.record_errors,
           x.groups_completed, x.groups_filled, x.groups_dropped, x.groups_refused,
           x.duplicates, x.unknown, x.open_groups);
}

/// Exemplar actor -> its group sinks: group `group`, dropped at its straggler timeout
/// (exemplar.straggler_policy: drop), will never come. The trainer admits another group in its
/// place (stages.rl.admission: staleness).
struct group_dropped {
  crucible::group_id group;

  friend bool operator==(const group_dropped&, const group_dropped&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, group_dropped& x) {
  return f(caf::meta::type_name("group_dropped"), x.group);
}

/// Trainer -> exemplar actor: the fate of every sample of `groups` (a storage::sample_fate),
/// decided at update `step` (trained) or when `step` updates were done (the others); `seq` is
/// the trainer's count of such decisions (trainer_progress::fates), kept in the store so that a
/// resumed run can tell the decisions its checkpoint counted from those it did not.
struct sample_fates {
  std::vector<group_id> groups;
  std::string fate;
  std::int64_t step = 0;
  std::int64_t seq = 0;

  friend bool operator==(const sample_fates&, const sample_fates&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sample_fates& x) {
  return f(caf::meta::type_name("sample_fates"), x.groups, x.fate, x.step, x.seq);
}

/// Rollout actor -> anyone who asks: its counters since it started.
struct rollout_stats {
  std::uint64_t groups_started = 0;   ///< tasks taken
  std::uint64_t groups_finished = 0;  ///< every member reported to the exemplar actor or lost
  std::uint64_t groups_abandoned = 0; ///< given up before evaluation (prompt, engine or exemplar errors; dropped at a stop)
  std::uint64_t completions = 0;      ///< completions received from the engine
  std::uint64_t format_errors = 0;    ///< of those, without usable code: never sent to an evaluator
  std::uint64_t evaluated = 0;        ///< verdicts received from the evaluators
  std::uint64_t eval_errors = 0;      ///< candidates the evaluators failed on (infrastructure): not reported
  std::uint64_t retries = 0;          ///< requests sent again after a busy refusal
  std::uint64_t in_flight = 0;        ///< groups under way now
  bool running = false;               ///< taking new tasks
  // Multi-turn episodes (rollout.turns > 1).
  std::uint64_t later_turns = 0;       ///< turns after an episode's first, sampled
  std::uint64_t turns_over_budget = 0; ///< episodes ended because their next prompt was over prompt.max_tokens
  std::uint64_t turns_lost = 0;        ///< episodes ended because their next turn could not be generated
  std::uint64_t groups_resumed = 0;    ///< groups an earlier process left in flight, continued (counted in groups_started)

  friend bool operator==(const rollout_stats&, const rollout_stats&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_stats& x) {
  return f(caf::meta::type_name("rollout_stats"), x.groups_started, x.groups_finished,
           x.groups_abandoned, x.completions, x.format_errors, x.evaluated, x.eval_errors,
           x.retries, x.in_flight, x.running, x.later_turns, x.turns_over_budget, x.turns_lost, x.groups_resumed);
}

/// Rollout actor -> trainer: the state of its task sampler (env::task_sampler::save text: the
/// records of every task and the generator), so that a checkpoint holds it and the rollout actor
/// that takes the same place after a resume continues it.
struct sampler_state {
  std::string text;

  friend bool operator==(const sampler_state&, const sampler_state&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampler_state& x) {
  return f(caf::meta::type_name("sampler_state"), x.text);
}

/// Learner -> coordinator: what one optimizer step did. In a data-parallel group every rank
/// reports the same numbers except `groups` and `dropped_stale` (its own share).
struct train_report {
  crucible::policy_version policy_version; ///< version published by this step
  std::uint64_t step = 0;          ///< optimizer updates applied so far
  std::uint64_t groups = 0;        ///< groups (SFT: examples) of this rank that entered the update
  std::uint64_t dropped_stale = 0; ///< groups older than max_staleness, discarded
  double loss = 0;
  double mean_reward = 0;          ///< over the global batch (GRPO)
  double grad_norm = 0;            ///< global L2 norm before clipping
  double lr = 0;                   ///< learning rate of the update
  double seconds = 0;              ///< wall time of the update (publication not included)
  double publish_seconds = 0;      ///< wall time of writing the new weights and sending them to the engines
  std::uint64_t tokens = 0;        ///< completion tokens of the global batch
  std::uint64_t sequences = 0;     ///< completions of the global batch
  std::uint64_t zero_advantage = 0; ///< of them, those whose advantage was 0: not forwarded (GRPO, no KL term)
  bool skipped = false;            ///< gradient not finite: no update, version unchanged

  friend bool operator==(const train_report&, const train_report&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, train_report& x) {
  return f(caf::meta::type_name("train_report"), x.policy_version, x.step, x.groups,
           x.dropped_stale, detail::exact{x.loss}, detail::exact{x.mean_reward}, detail::exact{x.grad_norm},
           detail::exact{x.lr}, detail::exact{x.seconds}, detail::exact{x.publish_seconds}, x.tokens, x.sequences,
           x.zero_advantage, x.skipped);
}

/// Coordinator -> every learner rank: the complete GRPO groups of one global step. Every rank
/// gets the same batch and trains on its share: rank r of W takes groups r, r + W, r + 2W, ...
/// (the order in which the exemplar actor deals groups to learners round robin).
struct learner_batch {
  std::vector<rollout_group> groups;
  double temperature = 1.0; ///< the sampling temperature the completions were drawn at

  friend bool operator==(const learner_batch&, const learner_batch&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, learner_batch& x) {
  return f(caf::meta::type_name("learner_batch"), x.groups, detail::exact{x.temperature});
}

/// Coordinator -> every learner rank: the supervised examples of one global SFT step, prompts[i]
/// followed by completions[i] (the loss covers the completion). Shared out like learner_batch.
struct sft_batch {
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<std::vector<std::int32_t>> completions; ///< same length as prompts

  friend bool operator==(const sft_batch&, const sft_batch&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sft_batch& x) {
  return f(caf::meta::type_name("sft_batch"), x.prompts, x.completions);
}

/// How busy one GPU of the trainer's process has been (env::device_uses): the share of its time
/// that evaluations and the policy's own work (generation, updates) held it.
struct device_busy {
  std::string device;       ///< "cuda:N"
  double seconds = 0;       ///< since the process began using it
  double evaluation_s = 0;  ///< an evaluation held it (references, trials, timed rounds, worker starts)
  double policy_s = 0;      ///< the policy's generation and updates held it
  bool evaluator = false;   ///< an evaluator of the process times verdicts on it
  bool engine = false;      ///< one of the policy's engines generates on it (engine.devices, else model.device)
  bool learner = false;     ///< a learner rank updates on it (learner.devices, else model.device)

  friend bool operator==(const device_busy&, const device_busy&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_busy& x) {
  return f(caf::meta::type_name("device_busy"), x.device, detail::exact{x.seconds}, detail::exact{x.evaluation_s},
           detail::exact{x.policy_s}, x.evaluator, x.engine, x.learner);
}

/// Trainer -> coordinator: what one step of the stage schedule did (actors/trainer.hpp).
struct stage_report {
  std::string stage;               ///< "warm_start", "sft", "self_supervised", "rl"; "" once the schedule is complete
  std::uint64_t stage_step = 0;    ///< updates of that stage so far
  std::uint64_t step = 0;          ///< learner updates in the run so far
  bool done = false;               ///< the schedule is complete: nothing is left to run
  crucible::policy_version policy_version;
  std::uint64_t variants = 0;      ///< scored variants in the run so far
  double best_speedup = std::numeric_limits<double>::quiet_NaN(); ///< over correct variants so far
  double mean_speedup = std::numeric_limits<double>::quiet_NaN(); ///< over correct variants so far
  std::uint64_t dropped_stale = 0; ///< samples (members of groups) dropped for staleness so far
  std::uint64_t discarded = 0;     ///< samples of groups that arrived and were never trained on (stage ends) so far
  std::uint64_t unfinished = 0;    ///< samples whose group never reached the trainer, or whose fate a crashed process decided after the last checkpoint
  std::vector<std::string> skipped_tasks; ///< tasks left out because their reference cannot run (tasks.skip_broken)
  std::vector<device_busy> devices; ///< the process's GPUs, how busy each has been
  std::vector<std::string> records; ///< metrics records of the step (one JSON object each), in order

  /// Field-wise equality in which two NaN speedups are equal.
  friend bool operator==(const stage_report& x, const stage_report& y) noexcept;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_report& x) {
  return f(caf::meta::type_name("stage_report"), x.stage, x.stage_step, x.step, x.done, x.policy_version, x.variants,
           detail::exact{x.best_speedup}, detail::exact{x.mean_speedup}, x.dropped_stale, x.discarded, x.unfinished,
           x.skipped_tasks, x.devices, x.records);
}

/// Learner -> engines and rollouts: weights of `policy_version` are on their way by NCCL
/// broadcast (the weights themselves never travel as CAF messages).
struct weights_published {
  crucible::policy_version policy_version;
  std::uint32_t buckets = 0; ///< number of broadcast buckets
  std::uint64_t bytes = 0;   ///< total payload

  friend bool operator==(const weights_published&, const weights_published&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, weights_published& x) {
  return f(caf::meta::type_name("weights_published"), x.policy_version, x.buckets, x.bytes);
}

// -- membership (nodes -> membership actor) --------------------------------------------------

/// One device a node offers.
struct device_info {
  std::uint32_t index = 0;   ///< device ordinal on its node (cuda:N)
  std::string name;          ///< device model, e.g. "NVIDIA H100 80GB HBM3"
  std::string hardware;      ///< hardware kind that exemplars and rewards are kept under
  std::uint64_t memory_bytes = 0;

  friend bool operator==(const device_info&, const device_info&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_info& x) {
  return f(caf::meta::type_name("device_info"), x.index, x.name, x.hardware, x.memory_bytes);
}

/// One task of the run as it travels to a joining node, whose evaluators need the sources
/// (the node rebuilds the env::task: its hash, the verdict cache's task key, from the source).
struct task_source {
  task_id task;          ///< catalogue key, the task's name, e.g. "level1/19_ReLU"
  std::string source;    ///< the KernelBench file
  std::int32_t level = 0;
  std::int32_t number = 0;

  friend bool operator==(const task_source&, const task_source&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, task_source& x) {
  return f(caf::meta::type_name("task_source"), x.task, x.source, x.level, x.number);
}

/// Membership actor -> joining node: what its evaluators need to measure as the run's own do.
struct run_setup {
  std::vector<task_source> tasks;
  /// The run's resolved configuration as YAML (core/config.hpp to_yaml): the node takes its
  /// `evaluator:` and `reward:` settings from it.
  std::string config;

  friend bool operator==(const run_setup&, const run_setup&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, run_setup& x) {
  return f(caf::meta::type_name("run_setup"), x.tasks, x.config);
}

/// Joining node -> membership actor, before it starts its evaluators: the run's tasks and
/// settings (a run_setup), please. The token is checked here already, so a wrong one fails
/// before any device starts.
struct tasks_request {
  std::string token; ///< shared secret of the run

  friend bool operator==(const tasks_request&, const tasks_request&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tasks_request& x) {
  return f(caf::meta::type_name("tasks_request"), x.token);
}

/// Joining node's agent -> membership actor: who I am and what I bring. The membership actor
/// takes the sender as the node's agent (heartbeats and leave come from it).
struct node_announce {
  std::string token; ///< shared secret of the run (blank in the membership actor's node list)
  std::string host;  ///< where the node runs, "hostname:pid"
  node_role role = node_role::evaluator;
  std::vector<device_info> devices;
  /// The node's actors for its role, actors[i] serving devices[i]: evaluator_actor handles for
  /// an evaluator node. Untyped here because the typed handles (actors/interfaces.hpp) are
  /// declared after this file's type-ID block.
  std::vector<caf::actor> actors;

  friend bool operator==(const node_announce&, const node_announce&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_announce& x) {
  return f(caf::meta::type_name("node_announce"), x.token, x.host, x.role, x.devices, x.actors,
           detail::check_enum(x.role));
}

/// Membership actor -> joining node: accepted, with the id it is known by from now on and the
/// heartbeat it must keep.
struct node_welcome {
  node_id node;
  std::string run;                ///< run name
  std::uint64_t heartbeat_ms = 0; ///< send a heartbeat this often
  std::uint64_t timeout_ms = 0;   ///< silent this long, the node is removed

  friend bool operator==(const node_welcome&, const node_welcome&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_welcome& x) {
  return f(caf::meta::type_name("node_welcome"), x.node, x.run, x.heartbeat_ms, x.timeout_ms);
}

// -- run status (coordinator -> CLI, status.json) --------------------------------------------

/// A snapshot of the run, as the coordinator replies it and writes it to status.json.
/// Speedups are NaN while no value exists (null in JSON).
struct run_status {
  run_state state = run_state::starting;
  std::string stage;          ///< current stage of the schedule; empty when none
  std::uint64_t step = 0;     ///< learner steps completed
  crucible::policy_version policy_version;
  std::uint64_t variants = 0; ///< candidates evaluated
  double best_speedup = std::numeric_limits<double>::quiet_NaN();
  double mean_speedup = std::numeric_limits<double>::quiet_NaN();
  std::uint64_t dropped_stale = 0; ///< samples (members of groups) dropped for exceeding max_staleness
  /// Samples of groups that arrived and were never trained on: left waiting when a stage ended
  /// (and, with run.on_pause drop, at a pause). Recorded in the replay store all the same.
  std::uint64_t discarded = 0;
  /// Samples recorded in the replay store whose group never reached the trainer (in flight at a
  /// pause, a stage's end or a crash), or whose fate a crashed process decided after the
  /// checkpoint the run resumed from (docs/replay.md, Samples and their fates).
  std::uint64_t unfinished = 0;
  /// Tasks this run leaves out because their reference cannot run (tasks.skip_broken), by name.
  std::vector<std::string> skipped_tasks;
  /// The trainer process's GPUs and the share of their time evaluations and the policy held
  /// them (written only where there are any).
  std::vector<device_busy> devices;

  /// Field-wise equality in which two NaN speedups ("no value yet") are equal.
  friend bool operator==(const run_status& x, const run_status& y) noexcept;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, run_status& x) {
  return f(caf::meta::type_name("run_status"), x.state, x.stage, x.step, x.policy_version,
           x.variants, detail::exact{x.best_speedup}, detail::exact{x.mean_speedup}, x.dropped_stale, x.discarded,
           x.unfinished, x.skipped_tasks, x.devices, detail::check_enum(x.state));
}

/// One-line JSON object, keys in declaration order; NaN speedups as null. The format of
/// runs/NAME/status.json.
std::string to_json(const run_status& x);

/// Writes the fields of `x` (state .. dropped_stale, speedups without a value as null) into
/// the object `w` has open; to_json and the coordinator's metrics records share it.
void write_fields(json_writer& w, const run_status& x);

/// Parses what to_json wrote (the `crucible status RUN` path). errc::corrupt, naming the key,
/// for malformed JSON, a missing key or a value of the wrong type.
result<run_status> run_status_from_json(std::string_view json);

} // namespace crucible

// -- the type-ID block ----------------------------------------------------------------------
// Append only: IDs are positional and must agree between all nodes of a cluster.

CAF_BEGIN_TYPE_ID_BLOCK(crucible, caf::first_custom_type_id)

  CAF_ADD_TYPE_ID(crucible, (crucible::task_id))
  CAF_ADD_TYPE_ID(crucible, (crucible::variant_id))
  CAF_ADD_TYPE_ID(crucible, (crucible::group_id))
  CAF_ADD_TYPE_ID(crucible, (crucible::policy_version))
  CAF_ADD_TYPE_ID(crucible, (crucible::node_id))
  CAF_ADD_TYPE_ID(crucible, (crucible::sampling_params))
  CAF_ADD_TYPE_ID(crucible, (crucible::generation_request))
  CAF_ADD_TYPE_ID(crucible, (crucible::completion))
  CAF_ADD_TYPE_ID(crucible, (crucible::generation_result))
  CAF_ADD_TYPE_ID(crucible, (crucible::candidate))
  CAF_ADD_TYPE_ID(crucible, (crucible::env::verdict))
  CAF_ADD_TYPE_ID(crucible, (crucible::scored_variant))
  CAF_ADD_TYPE_ID(crucible, (crucible::exemplar_request))
  CAF_ADD_TYPE_ID(crucible, (crucible::exemplar_set))
  CAF_ADD_TYPE_ID(crucible, (crucible::rollout_group))
  CAF_ADD_TYPE_ID(crucible, (crucible::train_report))
  CAF_ADD_TYPE_ID(crucible, (crucible::weights_published))
  CAF_ADD_TYPE_ID(crucible, (crucible::device_info))
  CAF_ADD_TYPE_ID(crucible, (crucible::node_announce))
  CAF_ADD_TYPE_ID(crucible, (crucible::node_welcome))
  CAF_ADD_TYPE_ID(crucible, (crucible::run_status))
  CAF_ADD_TYPE_ID(crucible, (std::vector<crucible::node_announce>))
  CAF_ADD_TYPE_ID(crucible, (std::vector<crucible::device_info>))
  CAF_ADD_TYPE_ID(crucible, (crucible::group_announce))
  CAF_ADD_TYPE_ID(crucible, (crucible::exemplar_stats))
  CAF_ADD_TYPE_ID(crucible, (crucible::generation_batch))
  CAF_ADD_TYPE_ID(crucible, (crucible::generation_batch_result))
  CAF_ADD_TYPE_ID(crucible, (crucible::weight_update))
  CAF_ADD_TYPE_ID(crucible, (crucible::engine_status))
  CAF_ADD_TYPE_ID(crucible, (crucible::rollout_stats))
  CAF_ADD_TYPE_ID(crucible, (crucible::learner_batch))
  CAF_ADD_TYPE_ID(crucible, (crucible::sft_batch))
  CAF_ADD_TYPE_ID(crucible, (crucible::stage_report))
  CAF_ADD_TYPE_ID(crucible, (crucible::task_source))
  CAF_ADD_TYPE_ID(crucible, (std::vector<crucible::task_source>))
  CAF_ADD_TYPE_ID(crucible, (crucible::tasks_request))
  CAF_ADD_TYPE_ID(crucible, (crucible::run_setup))
  CAF_ADD_TYPE_ID(crucible, (crucible::sampler_state))
  CAF_ADD_TYPE_ID(crucible, (crucible::sample_fates))
  CAF_ADD_TYPE_ID(crucible, (crucible::chat_turn))
  CAF_ADD_TYPE_ID(crucible, (crucible::group_extend))
  CAF_ADD_TYPE_ID(crucible, (crucible::stored_turn))
  CAF_ADD_TYPE_ID(crucible, (crucible::episode_resume))
  CAF_ADD_TYPE_ID(crucible, (crucible::episode_reopening))
  CAF_ADD_TYPE_ID(crucible, (crucible::group_dropped))

  // Verbs of the typed interfaces (actors/interfaces.hpp). On 0.17 atoms take no type ID.
  CAF_ADD_ATOM(crucible, crucible, start_atom, "start")
  CAF_ADD_ATOM(crucible, crucible, pause_atom, "pause")
  CAF_ADD_ATOM(crucible, crucible, resume_atom, "resume")
  CAF_ADD_ATOM(crucible, crucible, stop_atom, "stop")
  CAF_ADD_ATOM(crucible, crucible, advance_atom, "advance")
  CAF_ADD_ATOM(crucible, crucible, heartbeat_atom, "heartbeat")
  CAF_ADD_ATOM(crucible, crucible, collect_atom, "collect")
  CAF_ADD_ATOM(crucible, crucible, stall_atom, "stall")
  CAF_ADD_ATOM(crucible, crucible, drain_atom, "drain")
  CAF_ADD_ATOM(crucible, crucible, train_atom, "train")
  CAF_ADD_ATOM(crucible, crucible, save_atom, "save")
  CAF_ADD_ATOM(crucible, crucible, reset_atom, "reset")
  CAF_ADD_ATOM(crucible, crucible, expire_atom, "expire")
  CAF_ADD_ATOM(crucible, crucible, retry_atom, "retry")
  CAF_ADD_ATOM(crucible, crucible, settle_atom, "settle")
  CAF_ADD_ATOM(crucible, crucible, cancel_atom, "cancel")
  CAF_ADD_ATOM(crucible, crucible, reopen_atom, "reopen")
  CAF_ADD_ATOM(crucible, crucible, admit_atom, "admit")

CAF_END_TYPE_ID_BLOCK(crucible)
