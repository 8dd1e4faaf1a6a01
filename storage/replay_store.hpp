// storage/replay_store.hpp: the replay store, an SQLite database of every evaluated variant
// (code, verdict, provenance), deduplicated by normalised code per task and hardware.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "core/error.hpp"

struct sqlite3;

namespace crucible::storage {

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
  std::string checks_failed = "[]";  ///< JSON array text, e.g. ["shape","nan"]
  std::string message;
  std::uint64_t policy_version = 0;
  std::string prompt_id;
  std::uint64_t group_id = 0;
  std::string exemplar_ids = "[]";  ///< JSON array text of the variant ids it was prompted with
  std::int64_t time_ms = 0;         ///< unix ms of the kept verdict; record() fills 0 with now
  std::int64_t count = 1;           ///< times this code was recorded; record() adds `count`

  bool operator==(const variant_record&) const = default;
};

/// The replay store. One SQLite connection; not thread-safe (one owner, e.g. one actor).
/// Movable, not copyable. Several processes may open the same file (WAL, busy timeout).
class replay_store final {
public:
  /// Opens or creates the database at `path` (WAL, synchronous=FULL). errc::io names the file.
  static result<replay_store> open(const std::filesystem::path& path);

  replay_store(replay_store&& other) noexcept;
  replay_store& operator=(replay_store&& other) noexcept;
  replay_store(const replay_store&) = delete;
  replay_store& operator=(const replay_store&) = delete;
  ~replay_store();

  /// Records one evaluated variant and returns its row id; durable once this returns. The same
  /// (task_id, hardware, code_hash) is stored once: a repeat adds its count to the row and
  /// replaces the verdict and provenance only if its reward is strictly higher (best kept;
  /// ties keep the earlier). errc::invalid_arg for an empty key field or JSON fields that are
  /// not arrays.
  result<std::int64_t> record(const variant_record& v);

  /// The row with id `id`; errc::not_found when there is none.
  result<variant_record> find(std::int64_t id) const;

  /// Number of distinct rows (not the sum of counts).
  result<std::int64_t> count() const;

  /// Writes every row, in id order, as one JSON object per line to `path` (replaced
  /// atomically via a temporary file).
  result<void> export_jsonl(const std::filesystem::path& path) const;

  /// Merges the rows of a file written by export_jsonl, in one transaction: a malformed line
  /// (bad JSON, missing or mistyped field) is refused with errc::corrupt naming the file and
  /// its line number, and nothing is imported. Rows keep their exported id when it is free
  /// in this store; duplicates merge as in record(). Returns the number of lines imported.
  result<std::int64_t> import_jsonl(const std::filesystem::path& path);

  /// The database file.
  const std::filesystem::path& path() const noexcept { return path_; }

  /// Raw connection, for tests and maintenance (e.g. PRAGMA integrity_check).
  sqlite3* handle() const noexcept { return db_; }

private:
  replay_store(sqlite3* db, std::filesystem::path path) : db_(db), path_(std::move(path)) {}
  result<std::int64_t> upsert(const variant_record& v, bool keep_id);

  sqlite3* db_ = nullptr;
  std::filesystem::path path_;
};

} // namespace crucible::storage
