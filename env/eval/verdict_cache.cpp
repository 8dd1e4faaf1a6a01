#include "env/eval/verdict_cache.hpp"

#include <cstdlib>

#include <sqlite3.h>

namespace crucible::env {

namespace {

// Finalises a statement on every path out of a scope.
struct statement {
  sqlite3_stmt* s = nullptr;
  ~statement() { sqlite3_finalize(s); }
};

} // namespace

result<std::unique_ptr<verdict_cache>> verdict_cache::open(const std::filesystem::path& file) {
  std::error_code ec;
  if (file.has_parent_path())
    std::filesystem::create_directories(file.parent_path(), ec);
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(file.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return fail(errc::io, file.string(), ": cannot open the verdict cache: ", msg);
  }
  sqlite3_busy_timeout(db, 10000);
  const char* schema =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "CREATE TABLE IF NOT EXISTS verdicts ("
    "  task_sha256 TEXT NOT NULL, candidate_sha256 TEXT NOT NULL, hardware TEXT NOT NULL,"
    "  protocol TEXT NOT NULL, verdict TEXT NOT NULL, created REAL NOT NULL DEFAULT (julianday('now')),"
    "  PRIMARY KEY (task_sha256, candidate_sha256, hardware, protocol));";
  char* err = nullptr;
  if (sqlite3_exec(db, schema, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    sqlite3_close(db);
    return fail(errc::corrupt, file.string(), ": not a usable verdict cache: ", msg);
  }
  return std::unique_ptr<verdict_cache>(new verdict_cache(db));
}

verdict_cache::~verdict_cache() {
  sqlite3_close(db_);
}

std::optional<verdict> verdict_cache::find(const verdict_key& key) {
  std::lock_guard guard{mtx_};
  statement st;
  if (sqlite3_prepare_v2(db_,
                         "SELECT verdict FROM verdicts WHERE task_sha256=? AND candidate_sha256=? "
                         "AND hardware=? AND protocol=?",
                         -1, &st.s, nullptr) != SQLITE_OK)
    return std::nullopt;
  sqlite3_bind_text(st.s, 1, key.task_sha256.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.s, 2, key.candidate_sha256.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.s, 3, key.hardware.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.s, 4, key.protocol.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st.s) != SQLITE_ROW)
    return std::nullopt;
  auto text = reinterpret_cast<const char*>(sqlite3_column_text(st.s, 0));
  return text ? verdict_from_json(text) : std::nullopt;
}

result<void> verdict_cache::store(const verdict_key& key, const verdict& v) {
  std::lock_guard guard{mtx_};
  statement st;
  if (sqlite3_prepare_v2(db_,
                         "INSERT OR REPLACE INTO verdicts (task_sha256, candidate_sha256, hardware, protocol, verdict) "
                         "VALUES (?, ?, ?, ?, ?)",
                         -1, &st.s, nullptr) != SQLITE_OK)
    return fail(errc::io, "verdict cache: ", sqlite3_errmsg(db_));
  auto json = to_json(v);
  sqlite3_bind_text(st.s, 1, key.task_sha256.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.s, 2, key.candidate_sha256.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.s, 3, key.hardware.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.s, 4, key.protocol.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.s, 5, json.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st.s) != SQLITE_DONE)
    return fail(errc::io, "verdict cache: ", sqlite3_errmsg(db_));
  return {};
}

std::size_t verdict_cache::size() {
  std::lock_guard guard{mtx_};
  statement st;
  if (sqlite3_prepare_v2(db_, "SELECT COUNT(*) FROM verdicts", -1, &st.s, nullptr) != SQLITE_OK)
    return 0;
  if (sqlite3_step(st.s) != SQLITE_ROW)
    return 0;
  return static_cast<std::size_t>(sqlite3_column_int64(st.s, 0));
}

result<std::unique_ptr<verdict_cache>> verdict_cache::open_configured(const std::string& configured) {
  std::string path = configured;
  if (path.empty()) {
    const char* home = std::getenv("HOME");
    path = std::string{home != nullptr ? home : "/tmp"} + "/.cache/crucible/verdicts.db";
  }
  return open(path);
}

} // namespace crucible::env
