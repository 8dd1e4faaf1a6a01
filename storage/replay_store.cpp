// storage/replay_store.cpp: the replay store on SQLite (WAL): schema and its migrations, batched
// recording, exemplar queries, prompts, JSONL export and import, and the SFT export.
#include "storage/replay_store.hpp"

#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cmath>
#include <limits>
#include <string_view>
#include <utility>

#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "storage/atomic_file.hpp"
#include "storage/replay_store_detail.hpp"

namespace crucible::storage {

using detail::bind_text;
using detail::canonical_array_text;
using detail::exec;
using detail::in_transaction;
using detail::now_ms;
using detail::rollback;
using detail::column_text;
using detail::db_fail;
using detail::read_row;
using detail::reset_on_exit;
using detail::statement;
using detail::where;

namespace {

constexpr double nan_v = std::numeric_limits<double>::quiet_NaN();


// Canonical text of a JSON array of strings (checks_failed) or of integers (exemplar_ids);
// nullopt when `v` is not such an array.
std::optional<std::string> canonical_array(const json_value& v, bool strings) {
  if (!v.is_array()) return std::nullopt;
  std::string out = "[";
  bool first = true;
  for (const auto& e : v.as_array()) {
    if (!first) out += ',';
    first = false;
    if (strings) {
      if (!e.is_string()) return std::nullopt;
      append_json_string(out, e.as_string());
    } else {
      if (!e.is_int()) return std::nullopt;
      out += std::to_string(e.as_int());
    }
  }
  out += ']';
  return out;
}


std::string to_json_line(const variant_record& v) {
  json_writer w;
  w.begin_object()
    .field("id", v.id)
    .field("task_id", v.task_id)
    .field("task_name", v.task_name)
    .field("hardware", v.hardware)
    .field("code", v.code)
    .field("code_hash", v.code_hash)
    .field("status", v.status)
    .field("correct", v.correct)
    .key("speedup");
  if (v.speedup) w.value(*v.speedup); else w.null();
  w.field("spread", v.spread)
    .field("ref_ms", v.ref_ms)
    .field("cand_ms", v.cand_ms)
    .field("reward", v.reward);
  if (v.fraction)
    w.field("fraction", *v.fraction);
  w.key("checks_failed").raw(v.checks_failed)  // canonical JSON array (checked by record)
    .field("message", v.message)
    .field("policy_version", v.policy_version)
    .field("prompt_id", v.prompt_id)
    .field("group_id", v.group_id)
    .key("exemplar_ids").raw(v.exemplar_ids)
    .field("time_ms", v.time_ms)
    .field("count", v.count)
    .field("completion", v.completion)
    .end_object();
  return std::move(w).take();
}

// Reads one exported line into `v`; on failure returns what is wrong (no location).
std::optional<std::string> from_json(const json_value& j, variant_record& v) {
  if (!j.is_object()) return "not a JSON object";
  auto get = [&](const char* k) -> const json_value* { return j.find(k); };
  auto str = [&](const char* k, std::string& out) -> std::optional<std::string> {
    auto* f = get(k);
    if (!f || !f->is_string()) return std::string("field \"") + k + "\" missing or not a string";
    out = f->as_string();
    return std::nullopt;
  };
  auto integer = [&](const char* k, auto& out) -> std::optional<std::string> {
    auto* f = get(k);
    if (!f || !f->is_int()) return std::string("field \"") + k + "\" missing or not an integer";
    out = static_cast<std::remove_reference_t<decltype(out)>>(f->as_int());
    return std::nullopt;
  };
  auto real = [&](const char* k, double& out) -> std::optional<std::string> {
    auto* f = get(k);
    if (!f || !(f->is_number() || f->is_null()))
      return std::string("field \"") + k + "\" missing or not a number";
    out = f->is_null() ? nan_v : f->as_double();
    return std::nullopt;
  };
  auto array = [&](const char* k, bool strings, std::string& out) -> std::optional<std::string> {
    auto* f = get(k);
    std::optional<std::string> c;
    if (f) c = canonical_array(*f, strings);
    if (!c)
      return std::string("field \"") + k + "\" missing or not an array of " +
             (strings ? "strings" : "integers");
    out = *c;
    return std::nullopt;
  };
  std::optional<std::string> e;
  if ((e = integer("id", v.id)) || (e = str("task_id", v.task_id)) ||
      (e = str("task_name", v.task_name)) || (e = str("hardware", v.hardware)) ||
      (e = str("code", v.code)) || (e = str("code_hash", v.code_hash)) ||
      (e = str("status", v.status)))
    return e;
  auto* c = get("correct");
  if (!c || !c->is_bool()) return std::string("field \"correct\" missing or not a boolean");
  v.correct = c->as_bool();
  auto* s = get("speedup");
  if (!s || !(s->is_number() || s->is_null()))
    return std::string("field \"speedup\" missing or not a number");
  v.speedup = s->is_null() ? std::nullopt : std::optional<double>(s->as_double());
  if ((e = real("spread", v.spread)) || (e = real("ref_ms", v.ref_ms)) ||
      (e = real("cand_ms", v.cand_ms)) || (e = real("reward", v.reward)) ||
      (e = array("checks_failed", true, v.checks_failed)) || (e = str("message", v.message)) ||
      (e = integer("policy_version", v.policy_version)) || (e = str("prompt_id", v.prompt_id)) ||
      (e = integer("group_id", v.group_id)) || (e = array("exemplar_ids", false, v.exemplar_ids)) ||
      (e = integer("time_ms", v.time_ms)) || (e = integer("count", v.count)))
    return e;
  if (v.count < 1) return std::string("field \"count\" must be at least 1");
  v.fraction.reset();
  if (auto* f = get("fraction"); f && !f->is_null()) {  // absent in exports of schema 5 and before
    if (!f->is_number()) return std::string("field \"fraction\" is not a number");
    v.fraction = f->as_double();
  }
  v.completion.clear();
  if (auto* f = get("completion")) {  // absent in exports of schema 0
    if (!f->is_string()) return std::string("field \"completion\" is not a string");
    v.completion = f->as_string();
  }
  return std::nullopt;
}

double column_real(sqlite3_stmt* s, int i) {
  return sqlite3_column_type(s, i) == SQLITE_NULL ? nan_v : sqlite3_column_double(s, i);
}

// Schema 0, the first released schema, exactly as it created files. New files are created as
// schema 0 and then migrated, so every file takes the same path to the current schema.
constexpr const char* schema_v0 =
  "CREATE TABLE IF NOT EXISTS variants ("
  "  id INTEGER PRIMARY KEY,"
  "  task_id TEXT NOT NULL, task_name TEXT NOT NULL, hardware TEXT NOT NULL,"
  "  code TEXT NOT NULL, code_hash TEXT NOT NULL,"
  "  status TEXT NOT NULL, correct INTEGER NOT NULL, speedup REAL,"
  "  spread REAL, ref_ms REAL, cand_ms REAL, reward REAL,"  // NULL = not finite
  "  checks_failed TEXT NOT NULL, message TEXT NOT NULL,"
  "  policy_version INTEGER NOT NULL, prompt_id TEXT NOT NULL, group_id INTEGER NOT NULL,"
  "  exemplar_ids TEXT NOT NULL, time_ms INTEGER NOT NULL, count INTEGER NOT NULL,"
  "  UNIQUE (task_id, hardware, code_hash));";

// Schema 0 → 1: completions, prompts, the exemplar index and the hacking-case tables.
// - variants_successful is partial (successful rows only) and covering for the summary query of
//   successful_variants(), so an exemplar query reads index pages only, in the order it returns.
// - hack_checks splits checks_failed of flagged rows, one row per check, kept by triggers so that
//   record(), record_batch() and import all maintain it; variants_flagged lists flagged rows per
//   task. The flag condition is CRUCIBLE_FLAGGED_SQL.
constexpr const char* migrate_to_v1 =
  "ALTER TABLE variants ADD COLUMN completion TEXT NOT NULL DEFAULT '';"
  "CREATE TABLE prompts ("
  "  prompt_id TEXT PRIMARY KEY, text TEXT NOT NULL, created_ms INTEGER NOT NULL);"
  "CREATE INDEX variants_successful ON variants"
  "  (task_id, hardware, reward, code_hash, speedup, status, correct)"
  "  WHERE status = 'ok' AND correct = 1 AND speedup IS NOT NULL;"
  "CREATE INDEX variants_flagged ON variants (task_id, id) WHERE " CRUCIBLE_FLAGGED_SQL ";"
  "CREATE TABLE hack_checks ("
  "  check_name TEXT NOT NULL, variant_id INTEGER NOT NULL,"
  "  PRIMARY KEY (check_name, variant_id)) WITHOUT ROWID;"
  "CREATE INDEX hack_checks_variant ON hack_checks (variant_id);"
  "CREATE TRIGGER variants_hacks_insert AFTER INSERT ON variants"
  "  WHEN NEW.status = 'rejected' OR (NEW.status = 'incorrect' AND NEW.checks_failed <> '[]')"
  "  BEGIN INSERT OR IGNORE INTO hack_checks SELECT value, NEW.id FROM json_each(NEW.checks_failed);"
  "  END;"
  "CREATE TRIGGER variants_hacks_update AFTER UPDATE OF status, checks_failed ON variants"
  "  WHEN OLD.status IS NOT NEW.status OR OLD.checks_failed IS NOT NEW.checks_failed"
  "  BEGIN DELETE FROM hack_checks WHERE variant_id = OLD.id;"
  "  INSERT OR IGNORE INTO hack_checks SELECT value, NEW.id FROM json_each(NEW.checks_failed)"
  "    WHERE NEW.status = 'rejected' OR (NEW.status = 'incorrect' AND NEW.checks_failed <> '[]');"
  "  END;"
  "CREATE TRIGGER variants_hacks_delete AFTER DELETE ON variants"
  "  BEGIN DELETE FROM hack_checks WHERE variant_id = OLD.id; END;"
  "INSERT OR IGNORE INTO hack_checks SELECT j.value, v.id FROM variants v, json_each(v.checks_failed) j"
  "  WHERE " CRUCIBLE_FLAGGED_SQL ";";

// Schema 1 → 2: a completion holds its code block, so the code was written twice per row (a third
// of a row's bytes, and every byte is written twice more by the WAL and its checkpoint). From
// schema 2 on, `completion` is stored without the row's code where the code occurs in it, and
// completion_code_at is the byte offset to put the code back at; NULL (every older row) means the
// completion is stored whole. split_completion() and join_completion() are the two directions.
constexpr const char* migrate_to_v2 = "ALTER TABLE variants ADD COLUMN completion_code_at INTEGER;";

// Schema 2 → 3: one row per policy sample (a variant row merges every sample of the same code),
// with its own prompt id and whole completion and its fate (replay_store::set_group_fate,
// settle_samples). samples_undecided finds a group's undecided samples.
constexpr const char* migrate_to_v3 =
  "CREATE TABLE samples ("
  "  id INTEGER PRIMARY KEY, variant_id INTEGER NOT NULL, group_id INTEGER NOT NULL,"
  "  policy_version INTEGER NOT NULL, prompt_id TEXT NOT NULL, completion TEXT NOT NULL,"
  "  time_ms INTEGER NOT NULL, fate TEXT, fate_step INTEGER NOT NULL DEFAULT 0, fate_seq INTEGER);"
  "CREATE INDEX samples_undecided ON samples (group_id) WHERE fate IS NULL;"
  "CREATE INDEX samples_group ON samples (group_id, id);";

// Schema 3 → 4: a sample's place in a multi-turn episode (NULL for a sample of a one-turn group).
constexpr const char* migrate_to_v4 =
  "ALTER TABLE samples ADD COLUMN episode INTEGER;"
  "ALTER TABLE samples ADD COLUMN turn INTEGER;";

// Schema 4 → 5: what continues a multi-turn episode in a later process (replay_episodes.cpp):
// each turn's context, tokens, log-probs, verdict and whether its episode went on (NULL for
// other samples), and each group's first prompt.
constexpr const char* migrate_to_v5 =
  "ALTER TABLE samples ADD COLUMN context BLOB;"
  "ALTER TABLE samples ADD COLUMN tokens BLOB;"
  "ALTER TABLE samples ADD COLUMN logprobs BLOB;"
  "ALTER TABLE samples ADD COLUMN verdict TEXT;"
  "ALTER TABLE samples ADD COLUMN continues INTEGER;"
  "CREATE TABLE episode_groups ("
  "  group_id INTEGER PRIMARY KEY, task_id TEXT NOT NULL, turns INTEGER NOT NULL, episodes INTEGER NOT NULL,"
  "  system TEXT NOT NULL, user TEXT NOT NULL, prompt_id TEXT NOT NULL, exemplar_ids TEXT NOT NULL,"
  "  prompt_tokens BLOB NOT NULL, time_ms INTEGER NOT NULL);";

// Schema 5 → 6: each variant's fraction of its task's limit on its hardware (evaluator.limits;
// NULL where its verdict carried no bound), for exemplars bucketed by it (exemplar.score).
constexpr const char* migrate_to_v6 = "ALTER TABLE variants ADD COLUMN fraction REAL;";

// A repeat of (task_id, hardware, code_hash) adds its count and keeps the best verdict: the
// verdict and provenance columns switch to the new record only when its reward is strictly
// higher. All right-hand sides see the old row, so the CASEs agree with each other.
#define CRUCIBLE_BEST(c) c " = CASE WHEN excluded.reward > reward THEN excluded." c " ELSE " c " END"
constexpr const char* upsert_sql =
  "INSERT INTO variants (id, task_id, task_name, hardware, code, code_hash, status, correct,"
  " speedup, spread, ref_ms, cand_ms, reward, checks_failed, message, policy_version,"
  " prompt_id, group_id, exemplar_ids, time_ms, count, completion, completion_code_at, fraction)"
  " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,"
  " ?19, ?20, ?21, ?22, ?23, ?24)"
  " ON CONFLICT (task_id, hardware, code_hash) DO UPDATE SET count = count + excluded.count, "
  CRUCIBLE_BEST("task_name") ", " CRUCIBLE_BEST("code") ", " CRUCIBLE_BEST("status") ", "
  CRUCIBLE_BEST("correct") ", " CRUCIBLE_BEST("speedup") ", " CRUCIBLE_BEST("spread") ", "
  CRUCIBLE_BEST("ref_ms") ", " CRUCIBLE_BEST("cand_ms") ", " CRUCIBLE_BEST("fraction") ", " CRUCIBLE_BEST("checks_failed") ", "
  CRUCIBLE_BEST("message") ", " CRUCIBLE_BEST("policy_version") ", " CRUCIBLE_BEST("prompt_id")
  ", " CRUCIBLE_BEST("group_id") ", " CRUCIBLE_BEST("exemplar_ids") ", "
  CRUCIBLE_BEST("time_ms") ", " CRUCIBLE_BEST("completion") ", "
  CRUCIBLE_BEST("completion_code_at") ", " CRUCIBLE_BEST("reward")
  " RETURNING id";
#undef CRUCIBLE_BEST

// The WHERE of successful_variants(); it implies variants_successful's condition, so the
// planner can use that partial index.
#define CRUCIBLE_SUCCESS_WHERE                                                               \
  " WHERE task_id = ?1 AND hardware = ?2 AND status = 'ok' AND correct = 1"                 \
  " AND speedup IS NOT NULL AND reward IS NOT NULL ORDER BY reward, code_hash"

// Inserts a prompt unless its id exists; an existing id must hold the same text.
result<void> insert_prompt(sqlite3* db, const std::filesystem::path& path, sqlite3_stmt* ins,
                           sqlite3_stmt* get, std::string_view id, std::string_view text,
                           std::int64_t created_ms) {
  if (id.empty()) return fail(errc::invalid_arg, where(path), ": a prompt needs a prompt_id");
  {
    reset_on_exit r{ins};
    bind_text(ins, 1, id);
    bind_text(ins, 2, text);
    sqlite3_bind_int64(ins, 3, created_ms);
    if (sqlite3_step(ins) != SQLITE_DONE) return db_fail(db, path, "record prompt");
    if (sqlite3_changes(db) == 1) return {};
  }
  reset_on_exit r{get};
  bind_text(get, 1, id);
  if (sqlite3_step(get) != SQLITE_ROW) return db_fail(db, path, "prompt lookup");
  auto* p = static_cast<const char*>(sqlite3_column_blob(get, 1));
  std::string_view stored(p ? p : "", static_cast<std::size_t>(sqlite3_column_bytes(get, 1)));
  if (stored != text)
    return fail(errc::invalid_arg, where(path), ": prompt id ", std::string(id),
                " already holds a different text");
  return {};
}

std::string prompt_json_line(const prompt_record& p) {
  json_writer w;
  w.begin_object()
    .field("kind", "prompt")
    .field("prompt_id", p.prompt_id)
    .field("text", p.text)
    .field("created_ms", p.created_ms)
    .end_object();
  return std::move(w).take();
}

} // namespace

std::optional<std::string> detail::canonical_array_text(std::string_view text, bool strings) {
  if (text == "[]") return std::string(text);  // the common case, without a parse
  auto v = parse_json(text);
  if (!v.ok()) return std::nullopt;
  return canonical_array(*v, strings);
}

namespace detail {

std::optional<std::int64_t> split_completion(std::string_view completion, std::string_view code,
                                             std::string& rest) {
  // The code block is the completion's last one, so search from the end.
  const auto at = code.empty() ? std::string_view::npos : completion.rfind(code);
  if (at == std::string_view::npos) return std::nullopt;
  rest.assign(completion.substr(0, at));
  rest.append(completion.substr(at + code.size()));
  return static_cast<std::int64_t>(at);
}

std::string join_completion(std::string stored, std::string_view code, sqlite3_stmt* s, int at_col) {
  if (sqlite3_column_type(s, at_col) == SQLITE_NULL) return stored;  // stored whole
  const auto at = sqlite3_column_int64(s, at_col);
  // An offset past the end cannot be written by split_completion(); keep the text as stored.
  if (at < 0 || static_cast<std::uint64_t>(at) > stored.size()) return stored;
  stored.insert(static_cast<std::size_t>(at), code);
  return stored;
}

const char* const select_columns =
  "SELECT id, task_id, task_name, hardware, code, code_hash, status, correct, speedup, spread,"
  " ref_ms, cand_ms, reward, checks_failed, message, policy_version, prompt_id, group_id,"
  " exemplar_ids, time_ms, count, completion, completion_code_at, fraction FROM variants ";

const char* const select_columns_v =
  "SELECT v.id, v.task_id, v.task_name, v.hardware, v.code, v.code_hash, v.status, v.correct,"
  " v.speedup, v.spread, v.ref_ms, v.cand_ms, v.reward, v.checks_failed, v.message,"
  " v.policy_version, v.prompt_id, v.group_id, v.exemplar_ids, v.time_ms, v.count,"
  " v.completion, v.completion_code_at, v.fraction FROM ";

variant_record read_row(sqlite3_stmt* s) {
  variant_record v;
  v.id = sqlite3_column_int64(s, 0);
  v.task_id = column_text(s, 1);
  v.task_name = column_text(s, 2);
  v.hardware = column_text(s, 3);
  v.code = column_text(s, 4);
  v.code_hash = column_text(s, 5);
  v.status = column_text(s, 6);
  v.correct = sqlite3_column_int(s, 7) != 0;
  if (sqlite3_column_type(s, 8) != SQLITE_NULL) v.speedup = sqlite3_column_double(s, 8);
  v.spread = column_real(s, 9);
  v.ref_ms = column_real(s, 10);
  v.cand_ms = column_real(s, 11);
  v.reward = column_real(s, 12);
  v.checks_failed = column_text(s, 13);
  v.message = column_text(s, 14);
  v.policy_version = static_cast<std::uint64_t>(sqlite3_column_int64(s, 15));
  v.prompt_id = column_text(s, 16);
  v.group_id = static_cast<std::uint64_t>(sqlite3_column_int64(s, 17));
  v.exemplar_ids = column_text(s, 18);
  v.time_ms = sqlite3_column_int64(s, 19);
  v.count = sqlite3_column_int64(s, 20);
  v.completion = join_completion(column_text(s, 21), v.code, s, 22);
  if (sqlite3_column_type(s, 23) != SQLITE_NULL) v.fraction = sqlite3_column_double(s, 23);
  return v;
}

} // namespace detail

/// Statements prepared once per connection: preparing the upsert costs about as much as
/// running it, so a batch re-prepares nothing.
struct replay_store::statements {
  sqlite3_stmt* upsert = nullptr;
  sqlite3_stmt* id_taken = nullptr;
  sqlite3_stmt* find = nullptr;
  sqlite3_stmt* success_summary = nullptr;
  sqlite3_stmt* success_full = nullptr;
  sqlite3_stmt* prompt_insert = nullptr;
  sqlite3_stmt* prompt_get = nullptr;
  sqlite3_stmt* sample_insert = nullptr;
  std::string completion_rest;  // upsert's buffer for a completion without its code

  statements() = default;
  statements(const statements&) = delete;
  statements& operator=(const statements&) = delete;
  ~statements() {
    for (auto* s : {upsert, id_taken, find, success_summary, success_full, prompt_insert, prompt_get, sample_insert})
      sqlite3_finalize(s);
  }
};

/// WAL checkpoints on a thread of their own. A checkpoint copies the committed pages from the
/// WAL into the database file and fsyncs it: as many bytes again as the commits wrote, plus a
/// read of the WAL. SQLite's automatic checkpoint runs it in the committing thread, inside
/// record(); here the WAL hook of the store's connection wakes a thread with a second connection
/// instead, which copies the WAL while the recording thread goes on. The commits' durability is
/// the WAL fsync of each commit either way (synchronous=FULL): a checkpoint only moves pages
/// already durable, and SQLite's checkpoints are crash-safe whichever connection runs them.
/// If the thread falls behind, the recording thread completes the checkpoint itself once the WAL
/// reaches `inline_pages`, which bounds the WAL's size; if the thread cannot open its
/// connection, the recording thread checkpoints as SQLite's automatic checkpoint does.
struct replay_store::checkpointer {
  /// WAL size (pages) that wakes the thread: SQLite's default automatic checkpoint size.
  static constexpr int wake_pages = 1000;
  /// WAL size (pages) from which the committing thread checkpoints itself.
  static constexpr int inline_pages = 8 * wake_pages;

  explicit checkpointer(std::filesystem::path p) : path(std::move(p)) {}
  checkpointer(const checkpointer&) = delete;
  checkpointer& operator=(const checkpointer&) = delete;
  ~checkpointer() {
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    wake.notify_one();
    if (thread.joinable()) thread.join();
  }

  // sqlite3_wal_hook callback, after every commit of the store's connection; `pages` is the
  // WAL's size in frames.
  static int on_commit(void* self, sqlite3* db, const char* schema, int pages) {
    auto* c = static_cast<checkpointer*>(self);
    const bool alone = c->failed.load(std::memory_order_relaxed);
    if (alone && pages >= wake_pages) {
      // As SQLite's automatic checkpoint would.
      sqlite3_wal_checkpoint_v2(db, schema, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
    } else if (pages >= inline_pages) {
      // A writer that never pauses keeps the thread behind by the batch in flight, and the WAL
      // starts over only when a commit begins with every frame copied. So the writer waits for
      // the thread's checkpoint to end (SQLite does not wait for another checkpoint: BUSY) and
      // copies the rest itself, which bounds the WAL. Backpressure on the writer.
      std::lock_guard running(c->checkpointing);
      sqlite3_wal_checkpoint_v2(db, schema, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
    } else if (pages >= wake_pages && !alone) {
      std::lock_guard lock(c->mutex);
      if (!c->thread.joinable()) c->thread = std::thread([c] { c->run(); });  // on first need
      c->wanted = true;
      c->wake.notify_one();
    }
    return SQLITE_OK;
  }

  void run() {
    sqlite3* db = nullptr;
    if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK ||
        sqlite3_exec(db, "PRAGMA synchronous=FULL", nullptr, nullptr, nullptr) != SQLITE_OK) {
      sqlite3_close(db);
      failed.store(true, std::memory_order_relaxed);  // the committing thread takes over
      return;
    }
    sqlite3_busy_timeout(db, 10000);
    std::unique_lock lock(mutex);
    for (;;) {
      wake.wait(lock, [this] { return wanted || stop; });
      if (stop) break;
      wanted = false;
      lock.unlock();
      {
        // PASSIVE: copies what no reader still needs; never waits for, never blocks the writer.
        std::lock_guard running(checkpointing);
        sqlite3_wal_checkpoint_v2(db, "main", SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
      }
      lock.lock();
    }
    sqlite3_close(db);
  }

  std::filesystem::path path;
  std::mutex mutex;          // guards wanted, stop and thread
  std::mutex checkpointing;  // held by whichever thread runs a checkpoint
  std::condition_variable wake;
  bool wanted = false;
  bool stop = false;
  std::atomic<bool> failed{false};
  std::thread thread;
};

result<replay_store> replay_store::open(const std::filesystem::path& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return fail(errc::io, where(path), ": cannot open: ", msg);
  }
  auto give_up = [&](crucible::error e) {
    sqlite3_close(db);
    return e;
  };
  sqlite3_busy_timeout(db, 10000);
  // synchronous=FULL, not NORMAL: in WAL mode NORMAL already survives a process crash, but a
  // power loss or kernel panic may drop the last commits. record() promises the row is durable
  // once it returns. A writer that needs more than the disk's fsync rate in rows per second
  // batches them (record_batch: one commit per batch).
  if (auto r = exec(db, path, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", "configure");
      !r.ok())
    return give_up(r.error());

  auto user_version = [&]() -> result<int> {
    statement st;
    if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st.s, nullptr) != SQLITE_OK ||
        sqlite3_step(st.s) != SQLITE_ROW)
      return db_fail(db, path, "read schema version");
    return sqlite3_column_int(st.s, 0);
  };
  auto version = user_version();
  if (!version.ok()) return give_up(version.error());
  if (*version < schema_version) {
    // BEGIN IMMEDIATE: one process migrates; one that waited sees the new version and skips.
    if (auto r = exec(db, path, "BEGIN IMMEDIATE", "begin migration"); !r.ok())
      return give_up(r.error());
    version = user_version();
    result<void> step = version.ok() ? result<void>{} : result<void>{version.error()};
    if (step.ok() && *version == 0) {
      step = exec(db, path, schema_v0, "create schema");
      if (step.ok()) step = exec(db, path, migrate_to_v1, "migrate schema 0 to 1");
      if (step.ok()) step = exec(db, path, "PRAGMA user_version = 1", "set schema version");
      if (step.ok()) *version = 1;
    }
    if (step.ok() && *version == 1) {
      step = exec(db, path, migrate_to_v2, "migrate schema 1 to 2");
      if (step.ok()) step = exec(db, path, "PRAGMA user_version = 2", "set schema version");
      if (step.ok()) *version = 2;
    }
    if (step.ok() && *version == 2) {
      step = exec(db, path, migrate_to_v3, "migrate schema 2 to 3");
      if (step.ok()) step = exec(db, path, "PRAGMA user_version = 3", "set schema version");
      if (step.ok()) *version = 3;
    }
    if (step.ok() && *version == 3) {
      step = exec(db, path, migrate_to_v4, "migrate schema 3 to 4");
      if (step.ok()) step = exec(db, path, "PRAGMA user_version = 4", "set schema version");
      if (step.ok()) *version = 4;
    }
    if (step.ok() && *version == 4) {
      step = exec(db, path, migrate_to_v5, "migrate schema 4 to 5");
      if (step.ok()) step = exec(db, path, "PRAGMA user_version = 5", "set schema version");
      if (step.ok()) *version = 5;
    }
    if (step.ok() && *version == 5) {
      step = exec(db, path, migrate_to_v6, "migrate schema 5 to 6");
      if (step.ok()) step = exec(db, path, "PRAGMA user_version = 6", "set schema version");
    }
    if (step.ok()) step = exec(db, path, "COMMIT", "commit migration");
    if (!step.ok()) {
      rollback(db);
      return give_up(step.error());
    }
  }
  if (*version > schema_version)
    return give_up(fail(errc::unsupported, where(path), ": schema version ",
                        std::to_string(*version), " is newer than this build's (",
                        std::to_string(schema_version), ")"));

  // A file damaged past its first pages opens and reads its header fine, and fails (or, on a
  // damaged free list, loops) only when a query reaches the bad pages: a run resumed on such a
  // file once logged its stage and then nothing. SQLite's quick_check reads every page
  // (O(size), about a second per GB) and is refused here, naming the file.
  {
    statement qc;
    std::string found;
    int rc = sqlite3_prepare_v2(db, "PRAGMA quick_check(5)", -1, &qc.s, nullptr);
    if (rc == SQLITE_OK) {
      while ((rc = sqlite3_step(qc.s)) == SQLITE_ROW) {
        std::string line = reinterpret_cast<const char*>(sqlite3_column_text(qc.s, 0));
        if (line == "ok")
          continue;
        for (auto& c : line)
          if (c == '\n')
            c = ' ';
        found += (found.empty() ? "" : "; ") + line;
      }
    }
    if (rc != SQLITE_DONE && found.empty())
      found = sqlite3_errmsg(db);
    if (!found.empty())
      return give_up(fail(errc::corrupt, where(path), ": the replay store is damaged (SQLite's quick_check: ", found,
                          "); restore it from a copy, or move it aside: an empty store is made in its place at the next "
                          "start (a run's checkpoints do not depend on it; its exemplars start over)"));
  }

  auto st = std::make_unique<statements>();
  const std::string find_sql = std::string(detail::select_columns) + "WHERE id = ?1";
  const std::string full_sql = std::string(detail::select_columns) + CRUCIBLE_SUCCESS_WHERE;
  const std::pair<sqlite3_stmt**, const char*> prepared[] = {
    {&st->upsert, upsert_sql},
    {&st->id_taken, "SELECT 1 FROM variants WHERE id = ?1"},
    {&st->find, find_sql.c_str()},
    {&st->success_summary,
     "SELECT id, code_hash, speedup, reward, fraction FROM variants" CRUCIBLE_SUCCESS_WHERE},
    {&st->success_full, full_sql.c_str()},
    {&st->prompt_insert,
     "INSERT INTO prompts (prompt_id, text, created_ms) VALUES (?1, ?2, ?3)"
     " ON CONFLICT (prompt_id) DO NOTHING"},
    {&st->prompt_get, "SELECT prompt_id, text, created_ms FROM prompts WHERE prompt_id = ?1"},
    {&st->sample_insert,
     "INSERT INTO samples (variant_id, group_id, policy_version, prompt_id, completion, time_ms, fate, episode, turn,"
     " context, tokens, logprobs, verdict, continues) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"},
  };
  for (const auto& [slot, sql] : prepared)
    if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, slot, nullptr) != SQLITE_OK) {
      auto e = db_fail(db, path, "prepare");
      st.reset();
      return give_up(e);
    }
  // Replaces SQLite's automatic checkpoint (a WAL hook of its own) on this connection.
  auto ckpt = std::make_unique<checkpointer>(path);
  sqlite3_wal_hook(db, &checkpointer::on_commit, ckpt.get());
  return replay_store(db, path, std::move(st), std::move(ckpt));
}

replay_store::replay_store(sqlite3* db, std::filesystem::path path, std::unique_ptr<statements> st,
                           std::unique_ptr<checkpointer> ckpt)
    : db_(db), path_(std::move(path)), st_(std::move(st)), ckpt_(std::move(ckpt)) {}

replay_store::replay_store(replay_store&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)), path_(std::move(other.path_)),
      st_(std::move(other.st_)), ckpt_(std::move(other.ckpt_)) {}

namespace {

// Closes a store's connection: statements first, then the checkpointer's thread and connection,
// so that this connection is the last and its close checkpoints the WAL and removes it.
void close_store(sqlite3* db, auto& st, auto& ckpt) {
  st.reset();
  if (db) sqlite3_wal_hook(db, nullptr, nullptr);
  ckpt.reset();
  sqlite3_close(db);
}

} // namespace

replay_store& replay_store::operator=(replay_store&& other) noexcept {
  if (this != &other) {
    close_store(db_, st_, ckpt_);
    db_ = std::exchange(other.db_, nullptr);
    path_ = std::move(other.path_);
    st_ = std::move(other.st_);
    ckpt_ = std::move(other.ckpt_);
  }
  return *this;
}

replay_store::~replay_store() { close_store(db_, st_, ckpt_); }

result<std::int64_t> replay_store::record(const variant_record& v) {
  if (v.group_id == 0) return upsert(v, false);
  // The variant's row and the sample's, both or neither.
  return in_transaction(db_, path_, "record", [&]() -> result<std::int64_t> {
    auto id = upsert(v, false);
    if (id.ok())
      if (auto added = add_sample(v, *id); !added.ok()) return added.error();
    return id;
  });
}

result<void> replay_store::add_sample(const variant_record& v, std::int64_t variant_id) {
  if (v.group_id == 0) return {};
  if (!v.sample_fate.empty() && !sample_fate::known(v.sample_fate))
    return fail(errc::invalid_arg, where(path_), ": '", v.sample_fate, "' is not a sample fate");
  sqlite3_stmt* s = st_->sample_insert;
  reset_on_exit r{s};
  sqlite3_bind_int64(s, 1, variant_id);
  sqlite3_bind_int64(s, 2, static_cast<std::int64_t>(v.group_id));
  sqlite3_bind_int64(s, 3, static_cast<std::int64_t>(v.policy_version));
  bind_text(s, 4, v.prompt_id);
  bind_text(s, 5, v.completion);
  sqlite3_bind_int64(s, 6, v.time_ms != 0 ? v.time_ms : now_ms());
  if (v.sample_fate.empty()) sqlite3_bind_null(s, 7); else bind_text(s, 7, v.sample_fate);
  if (v.episode) sqlite3_bind_int64(s, 8, *v.episode); else sqlite3_bind_null(s, 8);
  if (v.turn) sqlite3_bind_int64(s, 9, *v.turn); else sqlite3_bind_null(s, 9);
  if (const auto& e = v.episode_data) {
    detail::bind_array(s, 10, std::span<const std::int32_t>(e->context));
    detail::bind_array(s, 11, std::span<const std::int32_t>(e->tokens));
    detail::bind_array(s, 12, std::span<const float>(e->logprobs));
    bind_text(s, 13, e->verdict);
    sqlite3_bind_int(s, 14, e->continues ? 1 : 0);
  }
  if (sqlite3_step(s) != SQLITE_DONE) return db_fail(db_, path_, "record sample");
  return {};
}

result<std::vector<std::int64_t>> replay_store::record_batch(std::span<const variant_record> rows) {
  std::vector<std::int64_t> ids;
  ids.reserve(rows.size());
  if (rows.empty()) return ids;
  return in_transaction(db_, path_, "batch", [&]() -> result<std::vector<std::int64_t>> {
    for (std::size_t i = 0; i < rows.size(); ++i) {
      auto id = upsert(rows[i], false);
      if (id.ok())
        if (auto added = add_sample(rows[i], *id); !added.ok()) id = added.error();
      if (!id.ok())
        return fail(id.error().code, id.error().message, " (row ", std::to_string(i), " of a batch of ",
                    std::to_string(rows.size()), "; nothing of the batch was recorded)");
      ids.push_back(*id);
    }
    return std::move(ids);
  });
}

result<std::int64_t> replay_store::upsert(const variant_record& in, bool keep_id) {
  if (in.task_id.empty() || in.hardware.empty() || in.code_hash.empty())
    return fail(errc::invalid_arg, where(path_), ": task_id, hardware and code_hash are required");
  if (in.count < 1) return fail(errc::invalid_arg, where(path_), ": count must be at least 1");
  auto checks = canonical_array_text(in.checks_failed, true);
  if (!checks)
    return fail(errc::invalid_arg, where(path_), ": checks_failed is not a JSON array of strings: ",
                in.checks_failed);
  auto exemplars = canonical_array_text(in.exemplar_ids, false);
  if (!exemplars)
    return fail(errc::invalid_arg, where(path_),
                ": exemplar_ids is not a JSON array of integers: ", in.exemplar_ids);

  bool bind_id = false;
  if (keep_id && in.id > 0) {
    sqlite3_stmt* q = st_->id_taken;
    reset_on_exit r{q};
    sqlite3_bind_int64(q, 1, in.id);
    int rc = sqlite3_step(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return db_fail(db_, path_, "id lookup");
    bind_id = rc == SQLITE_DONE;
  }

  sqlite3_stmt* s = st_->upsert;
  reset_on_exit r{s};
  auto real = [&](int i, double d) {
    if (std::isfinite(d)) sqlite3_bind_double(s, i, d); else sqlite3_bind_null(s, i);
  };
  if (bind_id) sqlite3_bind_int64(s, 1, in.id); else sqlite3_bind_null(s, 1);
  bind_text(s, 2, in.task_id);
  bind_text(s, 3, in.task_name);
  bind_text(s, 4, in.hardware);
  bind_text(s, 5, in.code);
  bind_text(s, 6, in.code_hash);
  bind_text(s, 7, in.status);
  sqlite3_bind_int(s, 8, in.correct ? 1 : 0);
  real(9, in.speedup ? *in.speedup : nan_v);
  real(10, in.spread);
  real(11, in.ref_ms);
  real(12, in.cand_ms);
  real(13, in.reward);
  bind_text(s, 14, *checks);
  bind_text(s, 15, in.message);
  sqlite3_bind_int64(s, 16, static_cast<std::int64_t>(in.policy_version));
  bind_text(s, 17, in.prompt_id);
  sqlite3_bind_int64(s, 18, static_cast<std::int64_t>(in.group_id));
  bind_text(s, 19, *exemplars);
  sqlite3_bind_int64(s, 20, in.time_ms != 0 ? in.time_ms : now_ms());
  sqlite3_bind_int64(s, 21, in.count);
  if (auto at = detail::split_completion(in.completion, in.code, st_->completion_rest)) {
    bind_text(s, 22, st_->completion_rest);
    sqlite3_bind_int64(s, 23, *at);
  } else {
    bind_text(s, 22, in.completion);
    sqlite3_bind_null(s, 23);
  }
  real(24, in.fraction ? *in.fraction : nan_v);
  if (sqlite3_step(s) != SQLITE_ROW) return db_fail(db_, path_, "record");
  std::int64_t id = sqlite3_column_int64(s, 0);
  if (sqlite3_step(s) != SQLITE_DONE) return db_fail(db_, path_, "record");
  return id;
}

result<variant_record> replay_store::find(std::int64_t id) const {
  sqlite3_stmt* s = st_->find;
  reset_on_exit r{s};
  sqlite3_bind_int64(s, 1, id);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_DONE)
    return fail(errc::not_found, where(path_), ": no variant with id ", std::to_string(id));
  if (rc != SQLITE_ROW) return db_fail(db_, path_, "find");
  return read_row(s);
}

result<std::int64_t> replay_store::count() const {
  statement st;
  if (sqlite3_prepare_v2(db_, "SELECT COUNT(*) FROM variants", -1, &st.s, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "prepare");
  if (sqlite3_step(st.s) != SQLITE_ROW) return db_fail(db_, path_, "count");
  return static_cast<std::int64_t>(sqlite3_column_int64(st.s, 0));
}

result<std::vector<variant_record>> replay_store::successful_variants(std::string_view task_id,
                                                                      std::string_view hardware,
                                                                      variant_fields fields) const {
  const bool full = fields == variant_fields::full;
  sqlite3_stmt* s = full ? st_->success_full : st_->success_summary;
  reset_on_exit r{s};
  bind_text(s, 1, task_id);
  bind_text(s, 2, hardware);
  std::vector<variant_record> out;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (full) {
      out.push_back(read_row(s));
      continue;
    }
    variant_record& v = out.emplace_back();
    v.id = sqlite3_column_int64(s, 0);
    v.task_id = task_id;
    v.hardware = hardware;
    v.code_hash = column_text(s, 1);
    v.status = "ok";
    v.correct = true;
    v.speedup = sqlite3_column_double(s, 2);
    v.reward = sqlite3_column_double(s, 3);
    if (sqlite3_column_type(s, 4) != SQLITE_NULL) v.fraction = sqlite3_column_double(s, 4);
  }
  if (rc != SQLITE_DONE) return db_fail(db_, path_, "successful variants");
  return out;
}

result<void> replay_store::record_prompt(std::string_view prompt_id, std::string_view text) {
  return insert_prompt(db_, path_, st_->prompt_insert, st_->prompt_get, prompt_id, text, now_ms());
}

result<prompt_record> replay_store::find_prompt(std::string_view prompt_id) const {
  sqlite3_stmt* s = st_->prompt_get;
  reset_on_exit r{s};
  bind_text(s, 1, prompt_id);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_DONE)
    return fail(errc::not_found, where(path_), ": no prompt with id ", std::string(prompt_id));
  if (rc != SQLITE_ROW) return db_fail(db_, path_, "find prompt");
  return prompt_record{column_text(s, 0), column_text(s, 1), sqlite3_column_int64(s, 2)};
}

result<void> replay_store::export_jsonl(const std::filesystem::path& path) const {
  std::string out;
  {
    statement st;
    if (sqlite3_prepare_v2(db_, "SELECT prompt_id, text, created_ms FROM prompts ORDER BY prompt_id",
                           -1, &st.s, nullptr) != SQLITE_OK)
      return db_fail(db_, path_, "prepare");
    int rc;
    while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
      out += prompt_json_line(
        {column_text(st.s, 0), column_text(st.s, 1), sqlite3_column_int64(st.s, 2)});
      out += '\n';
    }
    if (rc != SQLITE_DONE) return db_fail(db_, path_, "export");
  }
  statement st;
  std::string sql = std::string(detail::select_columns) + "ORDER BY id";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "prepare");
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
    out += to_json_line(read_row(st.s));
    out += '\n';
  }
  if (rc != SQLITE_DONE) return db_fail(db_, path_, "export");
  auto w = write_file_atomic(path, out);
  if (!w.ok())
    return fail(w.error().code, where(path_), ": export to ", path.string(), ": ",
                w.error().message);
  return {};
}

result<std::int64_t> replay_store::import_jsonl(const std::filesystem::path& path) {
  auto text = read_file(path);
  if (!text.ok()) return text.error();
  // Parse and check every line before touching the database.
  std::vector<variant_record> rows;
  std::vector<std::pair<std::int64_t, prompt_record>> prompts;  // with their line numbers
  std::string_view rest = *text;
  std::int64_t line_no = 0;
  auto where_line = [&](std::int64_t n) { return path.string() + ":" + std::to_string(n) + ": "; };
  while (!rest.empty()) {
    ++line_no;
    auto nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto j = parse_json(line, "line");
    if (!j.ok())
      return fail(errc::corrupt, "replay store import: ", where_line(line_no), j.error().message);
    if (const json_value* kind = j->is_object() ? j->find("kind") : nullptr) {
      if (!kind->is_string() || kind->as_string() != "prompt")
        return fail(errc::corrupt, "replay store import: ", where_line(line_no),
                    "field \"kind\" must be \"prompt\" where present");
      const json_value* id = j->find("prompt_id");
      const json_value* t = j->find("text");
      const json_value* created = j->find("created_ms");
      if (!id || !id->is_string() || id->as_string().empty() || !t || !t->is_string() ||
          !created || !created->is_int())
        return fail(errc::corrupt, "replay store import: ", where_line(line_no),
                    "a prompt line needs prompt_id (non-empty string), text (string) and "
                    "created_ms (integer)");
      prompts.emplace_back(line_no, prompt_record{id->as_string(), t->as_string(), created->as_int()});
      continue;
    }
    variant_record v;
    if (auto e = from_json(*j, v))
      return fail(errc::corrupt, "replay store import: ", where_line(line_no), *e);
    if (v.task_id.empty() || v.hardware.empty() || v.code_hash.empty())
      return fail(errc::corrupt, "replay store import: ", where_line(line_no),
                  "task_id, hardware and code_hash must not be empty");
    rows.push_back(std::move(v));
  }
  return in_transaction(db_, path_, "import", [&]() -> result<std::int64_t> {
    for (const auto& [n, p] : prompts) {
      auto r = insert_prompt(db_, path_, st_->prompt_insert, st_->prompt_get, p.prompt_id, p.text,
                             p.created_ms);
      if (!r.ok()) return fail(r.error().code, "replay store import: ", where_line(n), r.error().message);
    }
    for (const auto& v : rows)
      if (auto r = upsert(v, true); !r.ok()) return r.error();
    return static_cast<std::int64_t>(rows.size() + prompts.size());
  });
}

result<sft_export_stats> replay_store::export_sft_jsonl(const std::filesystem::path& path,
                                                        const sft_options& opts) const {
  if (!std::isfinite(opts.min_speedup))
    return fail(errc::invalid_arg, where(path_), ": SFT export: min_speedup must be finite");
  statement st;
  const char* sql =
    "SELECT v.id, v.task_id, v.hardware, v.speedup, v.completion, p.text, v.code,"
    " v.completion_code_at,"
    " (SELECT s.turn FROM samples s WHERE s.variant_id = v.id AND s.prompt_id = v.prompt_id"
    "  ORDER BY s.id DESC LIMIT 1)"
    " FROM variants v LEFT JOIN prompts p ON p.prompt_id = v.prompt_id"
    " WHERE v.status = 'ok' AND v.correct = 1 AND v.speedup IS NOT NULL AND v.speedup >= ?1"
    " AND (?2 = '' OR v.hardware = ?2) ORDER BY v.id";
  if (sqlite3_prepare_v2(db_, sql, -1, &st.s, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "prepare");
  sqlite3_bind_double(st.s, 1, opts.min_speedup);
  bind_text(st.s, 2, opts.hardware);
  sft_export_stats stats;
  std::string out;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
    if (sqlite3_column_type(st.s, 5) == SQLITE_NULL ||
        (sqlite3_column_bytes(st.s, 4) == 0 && sqlite3_column_type(st.s, 7) == SQLITE_NULL)) {
      ++stats.skipped;
      continue;
    }
    json_writer w;
    w.begin_object()
      .field("prompt", column_text(st.s, 5))
      .field("completion", detail::join_completion(column_text(st.s, 4), column_text(st.s, 6), st.s, 7))
      .field("task", column_text(st.s, 1))
      .field("speedup", sqlite3_column_double(st.s, 3))
      .field("hardware", column_text(st.s, 2))
      .field("variant_id", static_cast<std::int64_t>(sqlite3_column_int64(st.s, 0)));
    // A later turn of a multi-turn episode: its prompt holds the episode before it (the earlier
    // answers and the feedback on them), so the line is the whole episode up to this answer.
    if (sqlite3_column_type(st.s, 8) != SQLITE_NULL)
      w.field("turn", static_cast<std::int64_t>(sqlite3_column_int64(st.s, 8)));
    w.end_object();
    out += w.str();
    out += '\n';
    ++stats.written;
  }
  if (rc != SQLITE_DONE) return db_fail(db_, path_, "SFT export");
  auto w = write_file_atomic(path, out);
  if (!w.ok())
    return fail(w.error().code, where(path_), ": SFT export to ", path.string(), ": ",
                w.error().message);
  return stats;
}

} // namespace crucible::storage
