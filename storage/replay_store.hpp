// storage/replay_store.hpp: the replay store, an SQLite database of every evaluated variant
// (code, verdict, provenance), deduplicated by normalised code per task and hardware.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"

struct sqlite3;

namespace crucible::storage {

/// What a turn of a multi-turn episode needs to be picked up again by a later process (after a
/// crash, or a pause that dropped it): kept in its sample row (schema 5). Token ids and
/// log-probs are stored as little-endian 32-bit arrays.
struct episode_turn_data {
  std::vector<std::int32_t> context;  ///< the tokens the turn was sampled after; empty for turn 0 (the group's prompt)
  std::vector<std::int32_t> tokens;   ///< the completion's tokens
  std::vector<float> logprobs;        ///< one per token, under the sampling policy
  std::string verdict;                ///< the turn's whole verdict as JSON (env::to_json)
  bool continues = false;             ///< the episode went on after this turn

  bool operator==(const episode_turn_data&) const = default;
};

/// One evaluated variant as the replay store keeps it. Value type.
///
/// Layering (DESIGN.md §2): storage may not include env, so `code_hash` is computed by the
/// caller, as `crucible::sha256_hex(env::normalize_source(code))`; the store treats it as the
/// identity of the code and never recomputes it.
struct variant_record {
  std::int64_t id = 0;            ///< set by the store; ignored by record()
  std::string task_id;            ///< e.g. "level1/19_ReLU"
  std::string task_name;          ///< human-readable task name
  std::string hardware;           ///< hardware kind, e.g. "h100"
  std::string code;               ///< candidate source as generated
  std::string code_hash;          ///< sha256 hex of the normalised source (see above)
  std::string status;             ///< verdict status as text, e.g. "ok", "compile_error"
  bool correct = false;
  std::optional<double> speedup;  ///< absent when no timing was taken (stored as NULL)
  double spread = 0.0;
  double ref_ms = 0.0;
  double cand_ms = 0.0;
  double reward = 0.0;
  /// The candidate's fraction of its task's limit on this hardware (verdict::fraction(),
  /// evaluator.limits); absent where the verdict carried no bound, and in rows of schema 5 and
  /// before (stored as NULL).
  std::optional<double> fraction;
  std::string checks_failed = "[]";  ///< JSON array text, e.g. ["shape","nan"]
  std::string message;
  std::uint64_t policy_version = 0;
  std::string prompt_id;
  std::uint64_t group_id = 0;
  std::string exemplar_ids = "[]";  ///< JSON array text of the variant ids it was prompted with
  std::int64_t time_ms = 0;         ///< unix ms of the kept verdict; record() fills 0 with now
  std::int64_t count = 1;           ///< times this code was recorded; record() adds `count`
  std::string completion;  ///< full model response the code was parsed from; empty for seeds
  /// record() and record_batch() only, for a policy sample (group_id not 0): the fate its sample
  /// row starts with; empty: undecided (sample_fate). Not stored in the variant's row.
  std::string sample_fate;
  /// record() and record_batch() only, for a policy sample: its place in a multi-turn episode
  /// (the episode's number in its group, the turn from 0), kept in its sample row; absent for a
  /// sample of a one-turn group.
  std::optional<std::uint32_t> episode, turn;
  /// record() and record_batch() only, for a turn of a multi-turn episode: what a resumed run
  /// needs to continue its episode (episode_turn_data), kept in its sample row.
  std::optional<episode_turn_data> episode_data;

  bool operator==(const variant_record&) const = default;
};

/// A group of multi-turn episodes as its announce made it: the first prompt every later turn
/// continues (table episode_groups, schema 5). Value type.
struct episode_group_record {
  std::uint64_t group_id = 0;
  std::string task_id;
  std::uint32_t turns = 0;     ///< rollout.turns of the run that sampled it
  std::uint32_t episodes = 0;  ///< its episodes (G)
  std::string system, user;    ///< the first prompt's two messages
  std::string prompt_id;       ///< the first prompt's text (prompts table; record_prompt first)
  std::string exemplar_ids = "[]";  ///< JSON array of the exemplars the first prompt showed
  std::vector<std::int32_t> prompt_tokens;  ///< the first prompt as the engine tokenized it

  bool operator==(const episode_group_record&) const = default;
};

/// One stored turn of a group reopen_episode_groups() gives back.
struct stored_episode_turn {
  std::int64_t sample_id = 0;
  std::uint32_t episode = 0, turn = 0;
  std::uint64_t policy_version = 0;
  std::string completion;       ///< the whole response
  episode_turn_data data;

  bool operator==(const stored_episode_turn&) const = default;
};

/// A group of multi-turn episodes whose samples never reached a trainer, reopened to be
/// continued: the group, its first prompt's text, and its stored turns by episode and turn.
struct reopened_episode_group {
  episode_group_record group;
  std::string prompt;  ///< the first prompt's text ("" when the prompts table lacks it)
  std::vector<stored_episode_turn> turns;

  bool operator==(const reopened_episode_group&) const = default;
};

/// What became of a policy sample, the `fate` of its row in `samples` (docs/replay.md).
namespace sample_fate {
inline constexpr std::string_view trained = "trained";      ///< in the batch of update `step`
inline constexpr std::string_view paused = "paused";        ///< its group finished while the run paused (scored, not trained)
inline constexpr std::string_view stale = "stale";          ///< its group was dropped for staleness
inline constexpr std::string_view discarded = "discarded";  ///< its group arrived and was never trained on (a stage ended, or `run.on_pause: drop`)
inline constexpr std::string_view unfinished = "unfinished"; ///< its group never reached the trainer (in flight at a pause or crash), or its fate was decided after the checkpoint the run resumed from
inline constexpr std::string_view orphan = "orphan";        ///< scored after its group had been sent on or dropped (a straggler's late verdict)
inline constexpr std::string_view straggler = "straggler";  ///< its group was dropped at the straggler timeout (exemplar.on_straggler drop)
inline constexpr std::string_view searched = "searched";    ///< in the search stage's round that was run step `step` (scored and kept, no update)
/// Every fate, in the order sample_counts lists them.
inline constexpr std::string_view all[] = {trained, paused, stale, discarded, unfinished, orphan, straggler, searched};
/// Whether `fate` is one of `all`.
constexpr bool known(std::string_view fate) noexcept {
  for (auto f : all)
    if (f == fate) return true;
  return false;
}
} // namespace sample_fate

/// One policy sample as the replay store keeps it: a row of `samples`, pointing at its variant
/// (the deduplicated code and verdict). Value type.
struct sample_record {
  std::int64_t id = 0;
  std::int64_t variant_id = 0;  ///< the variants row of its code
  std::uint64_t group_id = 0;
  std::uint64_t policy_version = 0;
  std::string prompt_id;        ///< the prompt it was sampled on (prompts table); may be empty
  std::string completion;       ///< the policy's whole response, as written
  std::int64_t time_ms = 0;     ///< unix ms when it was recorded
  std::string fate;             ///< one of sample_fate::all; empty while undecided
  std::int64_t fate_step = 0;   ///< trained: the update; other trainer fates: the updates done then
  std::optional<std::int64_t> fate_seq;  ///< the trainer's fate counter (trainer fates only)
  /// Its place in a multi-turn episode (variant_record::episode, turn); absent for one turn.
  std::optional<std::uint32_t> episode, turn;

  bool operator==(const sample_record&) const = default;
};

/// The samples of a store by fate. Value type.
struct sample_counts {
  std::int64_t total = 0;
  std::int64_t pending = 0;  ///< no fate yet: groups in flight now
  std::int64_t trained = 0, paused = 0, stale = 0, discarded = 0, unfinished = 0, orphan = 0, straggler = 0, searched = 0;

  /// The count of `fate` (one of sample_fate::all; 0 for another string).
  std::int64_t of(std::string_view fate) const noexcept;
  /// "N samples: T trained, ..." with every non-zero fate.
  std::string text() const;
  bool operator==(const sample_counts&) const = default;
};

/// A prompt as the replay store keeps it: variants point at it through `prompt_id`. Value type.
struct prompt_record {
  std::string prompt_id;
  std::string text;            ///< the full prompt text the policy saw (chat template applied)
  std::int64_t created_ms = 0; ///< unix ms of the first record_prompt() call for this id

  bool operator==(const prompt_record&) const = default;
};

/// A hacking case: a variant the evaluator flagged, with the checks that caught it. A variant
/// is flagged when its status is "rejected", or "incorrect" with a non-empty checks_failed.
struct hack_case {
  variant_record variant;
  std::vector<std::string> checks;  ///< checks_failed split, e.g. {"static:threads"}
};

/// A hacking case ranked against a candidate by similar_hacks().
struct similar_hack {
  hack_case hack;
  double similarity = 0.0;  ///< Jaccard similarity of token 3-shingle sets, in [0, 1]
};

/// Which hacking cases list_hacks() and similar_hacks() consider; empty fields match all.
struct hack_filter {
  std::string task_id;
  std::string check;  ///< a check name, e.g. "runtime:timer"; only cases it caught
};

/// Which columns successful_variants() fills.
enum class variant_fields : std::uint8_t {
  summary,  ///< id, task_id, hardware, code_hash, status, correct, speedup, reward (index only)
  full,     ///< every column, as find() returns it
};

/// Options of export_sft_jsonl().
struct sft_options {
  double min_speedup = 1.0;  ///< verified variants with speedup ≥ this are written
  std::string hardware;      ///< only this hardware kind; empty: all
};

/// What export_sft_jsonl() wrote.
struct sft_export_stats {
  std::int64_t written = 0;
  std::int64_t skipped = 0;  ///< qualifying variants without a stored prompt text or completion
};

/// The replay store. One SQLite connection; not thread-safe (one owner, e.g. one actor).
/// Movable, not copyable. Several processes may open the same file (WAL, busy timeout). Once
/// the WAL first reaches 1000 pages, the store starts a thread with a second connection of its
/// own that copies the WAL into the database file (checkpoints), off the recording thread.
class replay_store final {
public:
  /// Schema version written to `PRAGMA user_version`. Version 0 is the first schema (variants
  /// only); open() upgrades older files in place. Version 3 added `samples`, 4 a sample's
  /// episode and turn, 5 what continues an episode (episode_groups, episode_turn_data).
  static constexpr int schema_version = 6;

  /// Opens or creates the database at `path` (WAL, synchronous=FULL) and upgrades an older
  /// schema in place, keeping its rows. errc::io names the file; errc::unsupported for a file
  /// written by a newer schema.
  static result<replay_store> open(const std::filesystem::path& path);

  replay_store(replay_store&& other) noexcept;
  replay_store& operator=(replay_store&& other) noexcept;
  replay_store(const replay_store&) = delete;
  replay_store& operator=(const replay_store&) = delete;
  ~replay_store();

  /// Records one evaluated variant and returns its row id; durable once this returns. The same
  /// (task_id, hardware, code_hash) is stored once: a repeat adds its count to the row and
  /// replaces the verdict and provenance (code and completion included) only if its reward is
  /// strictly higher (best kept; ties keep the earlier). A policy sample (group_id not 0) also
  /// gets a row of its own in `samples`, with its prompt id, whole completion and
  /// v.sample_fate, in the same transaction. errc::invalid_arg for an empty key field, JSON
  /// fields that are not arrays, or a sample_fate not in sample_fate::all.
  result<std::int64_t> record(const variant_record& v);

  /// Records `rows` as record() would, in one transaction: durable once this returns, and all
  /// or nothing (a row that fails rolls the whole batch back; the error names its index).
  /// Returns the row ids in input order. One commit (one fsync) per batch instead of per row.
  result<std::vector<std::int64_t>> record_batch(std::span<const variant_record> rows);

  /// The row with id `id`; errc::not_found when there is none.
  result<variant_record> find(std::int64_t id) const;

  /// Number of distinct rows (not the sum of counts).
  result<std::int64_t> count() const;

  /// The successful variants of (task_id, hardware): status "ok", correct, speedup and reward
  /// present; the candidates of select_exemplars(). Ordered by reward, then code_hash. With
  /// variant_fields::summary (the default) the rows come from a covering index and carry no
  /// code or provenance: fetch the chosen ones with find().
  result<std::vector<variant_record>> successful_variants(
    std::string_view task_id, std::string_view hardware,
    variant_fields fields = variant_fields::summary) const;

  /// Stores the text of prompt `prompt_id`; durable once this returns. Idempotent: the same id
  /// with the same text again changes nothing; the same id with another text is refused with
  /// errc::invalid_arg (a prompt id names one text).
  result<void> record_prompt(std::string_view prompt_id, std::string_view text);

  /// The prompt with this id; errc::not_found when there is none.
  result<prompt_record> find_prompt(std::string_view prompt_id) const;

  /// Sets the fate of the undecided samples of group `group_id` (not 0): `fate` one of
  /// sample_fate::all, `step` and `seq` as sample_record has them (`seq` for the trainer's fates).
  /// Returns how many samples it set; durable once this returns. errc::invalid_arg for another
  /// fate or group 0.
  result<std::int64_t> set_group_fate(std::uint64_t group_id, std::string_view fate, std::int64_t step,
                                      std::optional<std::int64_t> seq = std::nullopt);

  /// Marks sample_fate::unfinished every sample with no fate, and, with `kept_seq`, every sample
  /// whose trainer fate came after it (fate_seq > kept_seq: decided by a process after the
  /// checkpoint a run resumes from, which does not count it). Returns how many it marked.
  result<std::int64_t> settle_samples(std::optional<std::int64_t> kept_seq);

  /// The samples by fate.
  result<sample_counts> count_samples() const;

  /// The samples of group `group_id` (every sample with 0), in id order.
  result<std::vector<sample_record>> samples(std::uint64_t group_id = 0) const;

  /// Stores the first prompt of a group of multi-turn episodes; durable once this returns. The
  /// same group id again replaces it. errc::invalid_arg for group 0, an empty task, or
  /// exemplar_ids that is not a JSON array of integers.
  result<void> record_episode_group(const episode_group_record& g);

  /// The groups of multi-turn episodes a new process can continue: every sample of the group
  /// is `unfinished`, was sampled at a policy version in [min_version, max_version], and kept
  /// its episode_turn_data, and the group's first prompt is stored. Their samples become
  /// undecided again, in the same transaction (their fate is the group's next one), and the
  /// groups come back in id order with their turns by episode and turn, at most `limit` of
  /// them. A group that fails a condition, or is past the limit, is left as it is.
  result<std::vector<reopened_episode_group>> reopen_episode_groups(std::uint64_t min_version, std::uint64_t max_version,
                                                                    std::size_t limit);

  /// The largest group id of a policy sample below 2^63 (0: none). A new process numbers its
  /// groups above it (ids are rollout index * 2^40 + n), so that a crash's unfinished groups
  /// keep ids of their own.
  result<std::uint64_t> max_group_id() const;

  /// The hacking cases matching `filter`, in id order.
  result<std::vector<hack_case>> list_hacks(const hack_filter& filter = {}) const;

  /// The `k` hacking cases (matching `filter`) whose code is most similar to `code`: Jaccard
  /// similarity of token 3-shingle sets (see code_similarity.hpp; comments and whitespace do
  /// not count), highest first, ties by id. Exact: every matching case is compared.
  result<std::vector<similar_hack>> similar_hacks(std::string_view code, std::size_t k,
                                                  const hack_filter& filter = {}) const;

  /// Writes every prompt, then every variant in id order, as one JSON object per line to
  /// `path` (replaced atomically via a temporary file). Prompt lines carry "kind":"prompt".
  result<void> export_jsonl(const std::filesystem::path& path) const;

  /// Merges the prompts and rows of a file written by export_jsonl, in one transaction: a
  /// malformed line (bad JSON, missing or mistyped field) is refused with errc::corrupt naming
  /// the file and its line number, and nothing is imported. Rows keep their exported id when it
  /// is free in this store; duplicates merge as in record(). A variant line without
  /// "completion" (older exports) imports with an empty one. Returns the number of lines
  /// imported.
  result<std::int64_t> import_jsonl(const std::filesystem::path& path);

  /// Writes the SFT pairs of the verified variants (status "ok", correct, speedup ≥
  /// opts.min_speedup, of opts.hardware when given) to `path`, in id order, one JSON object per
  /// line: {"prompt","completion","task","speedup","hardware","variant_id"}; the file is
  /// replaced atomically. Variants without a stored prompt text or with an empty completion
  /// are skipped and counted.
  result<sft_export_stats> export_sft_jsonl(const std::filesystem::path& path,
                                            const sft_options& opts) const;

  /// The database file.
  const std::filesystem::path& path() const noexcept { return path_; }

  /// Raw connection, for tests and maintenance (e.g. PRAGMA integrity_check).
  sqlite3* handle() const noexcept { return db_; }

private:
  struct statements;    // prepared once per connection (replay_store.cpp)
  struct checkpointer;  // copies the WAL into the database file on a thread of its own

  replay_store(sqlite3* db, std::filesystem::path path, std::unique_ptr<statements> st,
               std::unique_ptr<checkpointer> ckpt);
  result<std::int64_t> upsert(const variant_record& v, bool keep_id);
  result<void> add_sample(const variant_record& v, std::int64_t variant_id);

  sqlite3* db_ = nullptr;
  std::filesystem::path path_;
  std::unique_ptr<statements> st_;
  std::unique_ptr<checkpointer> ckpt_;
};

} // namespace crucible::storage
