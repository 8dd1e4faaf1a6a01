// storage/replay_store_detail.hpp: internals shared by the replay store's source files
// (replay_store.cpp, replay_hacks.cpp); not part of the storage API.
#pragma once

#include <sqlite3.h>

#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "storage/replay_store.hpp"

namespace crucible::storage::detail {

/// An SQLite statement finalized on scope exit.
struct statement {
  sqlite3_stmt* s = nullptr;
  statement() = default;
  statement(const statement&) = delete;
  statement& operator=(const statement&) = delete;
  ~statement() { sqlite3_finalize(s); }
};

/// Resets a cached statement (ending its read transaction) and clears its bindings on scope exit.
struct reset_on_exit {
  sqlite3_stmt* s;
  explicit reset_on_exit(sqlite3_stmt* st) : s(st) {}
  reset_on_exit(const reset_on_exit&) = delete;
  reset_on_exit& operator=(const reset_on_exit&) = delete;
  ~reset_on_exit() {
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
  }
};

inline std::string where(const std::filesystem::path& path) { return "replay store " + path.string(); }

inline crucible::error db_fail(sqlite3* db, const std::filesystem::path& path, std::string_view what) {
  return fail(errc::io, where(path), ": ", what, ": ", sqlite3_errmsg(db));
}

inline std::string column_text(sqlite3_stmt* s, int i) {
  auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, i));
  return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(s, i))) : std::string();
}

/// Binds a 32-bit array as a little-endian BLOB (SQLITE_STATIC: bound while `xs` is alive).
template <class T>
void bind_array(sqlite3_stmt* s, int i, std::span<const T> xs) {
  static_assert(sizeof(T) == 4 && std::endian::native == std::endian::little,
                "the store's arrays are little-endian 32-bit values, as this machine holds them");
  sqlite3_bind_blob(s, i, xs.empty() ? "" : static_cast<const void*>(xs.data()), static_cast<int>(xs.size_bytes()),
                    SQLITE_STATIC);
}

/// The 32-bit array of BLOB column `i` (bind_array's); nullopt when its size is not a multiple of 4.
template <class T>
std::optional<std::vector<T>> column_array(sqlite3_stmt* s, int i) {
  static_assert(sizeof(T) == 4 && std::endian::native == std::endian::little);
  const auto n = static_cast<std::size_t>(sqlite3_column_bytes(s, i));
  if (n % sizeof(T) != 0) return std::nullopt;
  std::vector<T> out(n / sizeof(T));
  if (n > 0) std::memcpy(out.data(), sqlite3_column_blob(s, i), n);
  return out;
}

inline void bind_text(sqlite3_stmt* s, int i, std::string_view t) {
  // SQLITE_STATIC: every caller steps the statement while `t` is alive, then resets it.
  sqlite3_bind_text(s, i, t.data(), static_cast<int>(t.size()), SQLITE_STATIC);
}

/// The completion to store for a row whose code is `code`: when `code` occurs in `completion`
/// (its last occurrence), `rest` becomes the completion without it and the offset to put it back
/// at is returned (stored in completion_code_at); nullopt when it does not occur (stored whole).
std::optional<std::int64_t> split_completion(std::string_view completion, std::string_view code,
                                             std::string& rest);

/// The completion of a row read by `s`: `stored` (column completion) with `code` put back at the
/// offset in column `at_col` (completion_code_at); `stored` itself where that column is NULL.
std::string join_completion(std::string stored, std::string_view code, sqlite3_stmt* s, int at_col);

/// Unix time in milliseconds.
inline std::int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

/// Canonical text of a JSON array of strings (checks_failed) or of integers (exemplar_ids);
/// nullopt when `text` is not such an array.
std::optional<std::string> canonical_array_text(std::string_view text, bool strings);

/// Runs `sql`; errc::io naming the file and `what` on failure.
inline result<void> exec(sqlite3* db, const std::filesystem::path& path, const char* sql,
                  std::string_view what) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errmsg(db);
    sqlite3_free(err);
    return fail(errc::io, where(path), ": ", what, ": ", msg);
  }
  return {};
}

inline void rollback(sqlite3* db) { sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr); }

// Runs `body` (which returns a result) between BEGIN IMMEDIATE and COMMIT: all of it is recorded
// or, when it or the commit fails, nothing. `what` names the work in a failure's message.
template <class Body>
auto in_transaction(sqlite3* db, const std::filesystem::path& path, const std::string& what, Body&& body)
    -> decltype(body()) {
  if (auto r = exec(db, path, "BEGIN IMMEDIATE", "begin " + what); !r.ok()) return r.error();
  auto out = body();
  if (!out.ok()) {
    rollback(db);
    return out;
  }
  if (auto r = exec(db, path, "COMMIT", "commit " + what); !r.ok()) {
    rollback(db);
    return r.error();
  }
  return out;
}

/// Every column of `variants`, in read_row()'s order, ending in " FROM variants ".
extern const char* const select_columns;
/// The same columns qualified with the alias `v` (for joins), ending in " FROM ".
extern const char* const select_columns_v;

/// The row the statement is on, its columns as select_columns lists them.
variant_record read_row(sqlite3_stmt* s);

/// True for a hacking case's (status, checks_failed); matches the SQL of flagged_sql.
inline bool is_flagged(std::string_view status, std::string_view checks_failed) {
  return status == "rejected" || (status == "incorrect" && checks_failed != "[]");
}

/// SQL condition over `variants` columns that selects the hacking cases (a partial index
/// uses the same text, so queries must repeat it exactly).
#define CRUCIBLE_FLAGGED_SQL "(status = 'rejected' OR (status = 'incorrect' AND checks_failed <> '[]'))"

} // namespace crucible::storage::detail
