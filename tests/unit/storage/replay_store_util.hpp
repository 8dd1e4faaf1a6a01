// tests/unit/storage/replay_store_util.hpp: what test_replay_store.cpp and test_replay_schema.cpp
// share: a sample variant row, an episode group, and SQL run straight on a store's database.
#pragma once

#include <doctest/doctest.h>

#include <sqlite3.h>

#include <cstdint>
#include <string>

#include "storage/replay_store.hpp"

namespace crucible::storage::test {

inline variant_record sample(int i) {
  variant_record v;
  v.task_id = "level1/19_ReLU";
  v.task_name = "ReLU";
  v.hardware = "h100";
  v.code = "__global__ void k" + std::to_string(i) + "(float* x) { x[0] = 0.1; }\n\"q\"\t\\";
  v.code_hash = "hash-" + std::to_string(i);
  v.status = "ok";
  v.correct = true;
  v.speedup = 1.25 + i;
  v.spread = 0.03;
  v.ref_ms = 0.1 + i;
  v.cand_ms = 0.08;
  v.reward = 0.5 + 0.1 * i;
  v.checks_failed = R"(["shape","nan"])";
  v.message = "fine \xC3\xA9";
  v.policy_version = 7;
  v.prompt_id = "p-" + std::to_string(i);
  v.group_id = 42;
  v.exemplar_ids = "[1,2,3]";
  v.time_ms = 1700000000000 + i;
  v.completion = "## Code Implementation\n```python\n" + v.code + "\n```";
  return v;
}

inline std::int64_t exec_int(sqlite3* db, const char* sql) {
  sqlite3_stmt* s = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, sql, -1, &s, nullptr) == SQLITE_OK);
  std::int64_t out = -1;
  if (sqlite3_step(s) == SQLITE_ROW) out = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  return out;
}

inline void exec_ok(sqlite3* db, const std::string& sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  INFO(sql, ": ", err ? err : "");
  sqlite3_free(err);
  REQUIRE(rc == SQLITE_OK);
}

inline std::string exec_text(sqlite3* db, const char* sql) {
  sqlite3_stmt* s = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, sql, -1, &s, nullptr) == SQLITE_OK);
  std::string out;
  if (sqlite3_step(s) == SQLITE_ROW) out = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
  sqlite3_finalize(s);
  return out;
}

inline episode_group_record episode_group(std::uint64_t group) {
  episode_group_record g;
  g.group_id = group;
  g.task_id = "level1/19_ReLU";
  g.turns = 3;
  g.episodes = 2;
  g.system = "system text";
  g.user = "user text";
  g.prompt_id = "p-" + std::to_string(group);
  g.exemplar_ids = "[4,5]";
  g.prompt_tokens = {10, 11, 12, 2147483647, -2147483647 - 1};
  return g;
}

} // namespace crucible::storage::test
