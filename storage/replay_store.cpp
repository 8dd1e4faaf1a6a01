// storage/replay_store.cpp: the replay store on SQLite (WAL), with JSONL export and import.
#include "storage/replay_store.hpp"

#include <sqlite3.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <limits>
#include <string_view>
#include <utility>

#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "storage/atomic_file.hpp"

namespace crucible::storage {
namespace {

constexpr double nan_v = std::numeric_limits<double>::quiet_NaN();

struct statement {
  sqlite3_stmt* s = nullptr;
  statement() = default;
  statement(const statement&) = delete;
  statement& operator=(const statement&) = delete;
  ~statement() { sqlite3_finalize(s); }
};

std::string where(const std::filesystem::path& path) { return "replay store " + path.string(); }

crucible::error db_fail(sqlite3* db, const std::filesystem::path& path, std::string_view what) {
  return fail(errc::io, where(path), ": ", what, ": ", sqlite3_errmsg(db));
}

std::int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

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

std::optional<std::string> canonical_array_text(std::string_view text, bool strings) {
  auto v = parse_json(text);
  if (!v.ok()) return std::nullopt;
  return canonical_array(*v, strings);
}

void append_double(std::string& out, double d) {
  if (!std::isfinite(d)) {
    out += "null";
    return;
  }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);  // shortest text that round-trips
  out.append(buf, r.ptr);
}

void key(std::string& out, std::string_view k, bool first = false) {
  if (!first) out += ',';
  append_json_string(out, k);
  out += ':';
}

std::string to_json_line(const variant_record& v) {
  std::string o = "{";
  key(o, "id", true);
  o += std::to_string(v.id);
  key(o, "task_id"); append_json_string(o, v.task_id);
  key(o, "task_name"); append_json_string(o, v.task_name);
  key(o, "hardware"); append_json_string(o, v.hardware);
  key(o, "code"); append_json_string(o, v.code);
  key(o, "code_hash"); append_json_string(o, v.code_hash);
  key(o, "status"); append_json_string(o, v.status);
  key(o, "correct"); o += v.correct ? "true" : "false";
  key(o, "speedup");
  if (v.speedup) append_double(o, *v.speedup); else o += "null";
  key(o, "spread"); append_double(o, v.spread);
  key(o, "ref_ms"); append_double(o, v.ref_ms);
  key(o, "cand_ms"); append_double(o, v.cand_ms);
  key(o, "reward"); append_double(o, v.reward);
  key(o, "checks_failed"); o += v.checks_failed;  // canonical JSON array (checked by record)
  key(o, "message"); append_json_string(o, v.message);
  key(o, "policy_version"); o += std::to_string(v.policy_version);
  key(o, "prompt_id"); append_json_string(o, v.prompt_id);
  key(o, "group_id"); o += std::to_string(v.group_id);
  key(o, "exemplar_ids"); o += v.exemplar_ids;
  key(o, "time_ms"); o += std::to_string(v.time_ms);
  key(o, "count"); o += std::to_string(v.count);
  o += '}';
  return o;
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
  return std::nullopt;
}

double column_real(sqlite3_stmt* s, int i) {
  return sqlite3_column_type(s, i) == SQLITE_NULL ? nan_v : sqlite3_column_double(s, i);
}

std::string column_text(sqlite3_stmt* s, int i) {
  auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, i));
  return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(s, i))) : std::string();
}

constexpr const char* select_columns =
  "SELECT id, task_id, task_name, hardware, code, code_hash, status, correct, speedup, spread,"
  " ref_ms, cand_ms, reward, checks_failed, message, policy_version, prompt_id, group_id,"
  " exemplar_ids, time_ms, count FROM variants ";

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
  return v;
}

} // namespace

result<replay_store> replay_store::open(const std::filesystem::path& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return fail(errc::io, where(path), ": cannot open: ", msg);
  }
  sqlite3_busy_timeout(db, 10000);
  // synchronous=FULL, not NORMAL: in WAL mode NORMAL already survives a process crash, but a
  // power loss or kernel panic may drop the last commits. record() promises the row is durable
  // once it returns, and the write rate (one row per evaluated variant, each of which costs
  // a compile and a GPU run) is far too low for the extra fsync per commit to matter.
  const char* schema =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=FULL;"
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
  char* err = nullptr;
  if (sqlite3_exec(db, schema, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    sqlite3_close(db);
    return fail(errc::io, where(path), ": cannot create schema: ", msg);
  }
  return replay_store(db, path);
}

replay_store::replay_store(replay_store&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)), path_(std::move(other.path_)) {}

replay_store& replay_store::operator=(replay_store&& other) noexcept {
  if (this != &other) {
    sqlite3_close(db_);
    db_ = std::exchange(other.db_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

replay_store::~replay_store() { sqlite3_close(db_); }

result<std::int64_t> replay_store::record(const variant_record& v) { return upsert(v, false); }

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
    statement q;
    if (sqlite3_prepare_v2(db_, "SELECT 1 FROM variants WHERE id = ?1", -1, &q.s, nullptr) !=
        SQLITE_OK)
      return db_fail(db_, path_, "prepare");
    sqlite3_bind_int64(q.s, 1, in.id);
    int rc = sqlite3_step(q.s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return db_fail(db_, path_, "id lookup");
    bind_id = rc == SQLITE_DONE;
  }

  // A repeat of (task_id, hardware, code_hash) adds its count and keeps the best verdict: the
  // verdict and provenance columns switch to the new record only when its reward is strictly
  // higher. All right-hand sides see the old row, so the CASEs agree with each other.
#define CRUCIBLE_BEST(c) c " = CASE WHEN excluded.reward > reward THEN excluded." c " ELSE " c " END"
  static constexpr const char* sql =
    "INSERT INTO variants (id, task_id, task_name, hardware, code, code_hash, status, correct,"
    " speedup, spread, ref_ms, cand_ms, reward, checks_failed, message, policy_version,"
    " prompt_id, group_id, exemplar_ids, time_ms, count)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,"
    " ?19, ?20, ?21)"
    " ON CONFLICT (task_id, hardware, code_hash) DO UPDATE SET count = count + excluded.count, "
    CRUCIBLE_BEST("task_name") ", " CRUCIBLE_BEST("code") ", " CRUCIBLE_BEST("status") ", "
    CRUCIBLE_BEST("correct") ", " CRUCIBLE_BEST("speedup") ", " CRUCIBLE_BEST("spread") ", "
    CRUCIBLE_BEST("ref_ms") ", " CRUCIBLE_BEST("cand_ms") ", " CRUCIBLE_BEST("checks_failed") ", "
    CRUCIBLE_BEST("message") ", " CRUCIBLE_BEST("policy_version") ", " CRUCIBLE_BEST("prompt_id")
    ", " CRUCIBLE_BEST("group_id") ", " CRUCIBLE_BEST("exemplar_ids") ", "
    CRUCIBLE_BEST("time_ms") ", " CRUCIBLE_BEST("reward")
    " RETURNING id";
#undef CRUCIBLE_BEST
  statement st;
  if (sqlite3_prepare_v2(db_, sql, -1, &st.s, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "prepare");
  auto text = [&](int i, const std::string& s) {
    sqlite3_bind_text(st.s, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  };
  auto real = [&](int i, double d) {
    if (std::isfinite(d)) sqlite3_bind_double(st.s, i, d); else sqlite3_bind_null(st.s, i);
  };
  if (bind_id) sqlite3_bind_int64(st.s, 1, in.id); else sqlite3_bind_null(st.s, 1);
  text(2, in.task_id);
  text(3, in.task_name);
  text(4, in.hardware);
  text(5, in.code);
  text(6, in.code_hash);
  text(7, in.status);
  sqlite3_bind_int(st.s, 8, in.correct ? 1 : 0);
  real(9, in.speedup ? *in.speedup : nan_v);
  real(10, in.spread);
  real(11, in.ref_ms);
  real(12, in.cand_ms);
  real(13, in.reward);
  text(14, *checks);
  text(15, in.message);
  sqlite3_bind_int64(st.s, 16, static_cast<std::int64_t>(in.policy_version));
  text(17, in.prompt_id);
  sqlite3_bind_int64(st.s, 18, static_cast<std::int64_t>(in.group_id));
  text(19, *exemplars);
  sqlite3_bind_int64(st.s, 20, in.time_ms != 0 ? in.time_ms : now_ms());
  sqlite3_bind_int64(st.s, 21, in.count);
  if (sqlite3_step(st.s) != SQLITE_ROW) return db_fail(db_, path_, "record");
  std::int64_t id = sqlite3_column_int64(st.s, 0);
  if (sqlite3_step(st.s) != SQLITE_DONE) return db_fail(db_, path_, "record");
  return id;
}

result<variant_record> replay_store::find(std::int64_t id) const {
  statement st;
  std::string sql = std::string(select_columns) + "WHERE id = ?1";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "prepare");
  sqlite3_bind_int64(st.s, 1, id);
  int rc = sqlite3_step(st.s);
  if (rc == SQLITE_DONE)
    return fail(errc::not_found, where(path_), ": no variant with id ", std::to_string(id));
  if (rc != SQLITE_ROW) return db_fail(db_, path_, "find");
  return read_row(st.s);
}

result<std::int64_t> replay_store::count() const {
  statement st;
  if (sqlite3_prepare_v2(db_, "SELECT COUNT(*) FROM variants", -1, &st.s, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "prepare");
  if (sqlite3_step(st.s) != SQLITE_ROW) return db_fail(db_, path_, "count");
  return static_cast<std::int64_t>(sqlite3_column_int64(st.s, 0));
}

result<void> replay_store::export_jsonl(const std::filesystem::path& path) const {
  statement st;
  std::string sql = std::string(select_columns) + "ORDER BY id";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "prepare");
  std::string out;
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
  std::string_view rest = *text;
  std::int64_t line_no = 0;
  while (!rest.empty()) {
    ++line_no;
    auto nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto where_line = [&] { return path.string() + ":" + std::to_string(line_no) + ": "; };
    auto j = parse_json(line, "line");
    if (!j.ok())
      return fail(errc::corrupt, "replay store import: ", where_line(), j.error().message);
    variant_record v;
    if (auto e = from_json(*j, v))
      return fail(errc::corrupt, "replay store import: ", where_line(), *e);
    if (v.task_id.empty() || v.hardware.empty() || v.code_hash.empty())
      return fail(errc::corrupt, "replay store import: ", where_line(),
                  "task_id, hardware and code_hash must not be empty");
    rows.push_back(std::move(v));
  }
  if (sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "begin import");
  for (const auto& v : rows) {
    auto r = upsert(v, true);
    if (!r.ok()) {
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      return r.error();
    }
  }
  if (sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    auto e = db_fail(db_, path_, "commit import");
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return e;
  }
  return static_cast<std::int64_t>(rows.size());
}

} // namespace crucible::storage
