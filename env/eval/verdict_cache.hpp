// env/eval/verdict_cache.hpp: verdicts kept in SQLite by (task source hash, normalised candidate
// hash, hardware kind, protocol key), so a resubmitted candidate is not measured again.
#pragma once

#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "core/error.hpp"
#include "env/verdict.hpp"

struct sqlite3;

namespace crucible::env {

/// The key of one cached verdict.
struct verdict_key {
  std::string task_sha256;
  std::string candidate_sha256; ///< of normalize_source(candidate)
  std::string hardware;         ///< device model
  std::string protocol;         ///< protocol version + every option that changes a verdict
};

/// A SQLite file in WAL mode shared by every evaluator of a process (and across processes:
/// SQLite's locking serialises writers). Thread-safe.
class verdict_cache final {
public:
  /// Opens or creates the cache file (and its directory).
  static result<std::unique_ptr<verdict_cache>> open(const std::filesystem::path& file);
  /// The cache `evaluator.cache` names, or ~/.cache/crucible/verdicts.db when it is empty
  /// ($HOME, else /tmp).
  static result<std::unique_ptr<verdict_cache>> open_configured(const std::string& configured);
  ~verdict_cache();
  verdict_cache(const verdict_cache&) = delete;
  verdict_cache& operator=(const verdict_cache&) = delete;

  /// The cached verdict for `key`, if any.
  std::optional<verdict> find(const verdict_key& key);
  /// Stores (or replaces) the verdict for `key`.
  result<void> store(const verdict_key& key, const verdict& v);
  /// Number of cached verdicts.
  std::size_t size();

private:
  explicit verdict_cache(sqlite3* db) : db_(db) {}
  std::mutex mtx_;
  sqlite3* db_;
};

} // namespace crucible::env
