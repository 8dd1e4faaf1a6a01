// tests/unit/storage/test_replay_schema.cpp: replay stores of every older schema upgraded in place
// when opened, keeping their rows; a store of a newer schema refused.
#include <doctest/doctest.h>

#include <sqlite3.h>

#include <optional>
#include <string>

#include "storage/replay_store.hpp"
#include "replay_store_util.hpp"
#include "storage_test_util.hpp"

using namespace crucible;
using namespace crucible::storage;
using crucible::storage::test::episode_group;
using crucible::storage::test::exec_int;
using crucible::storage::test::exec_ok;
using crucible::storage::test::exec_text;
using crucible::storage::test::sample;
using crucible::testing::temp_dir;

TEST_CASE("a store of the first schema is upgraded in place and keeps its rows") {
  temp_dir tmp;
  const auto db_path = tmp.path() / "replay.db";
  {
    // The schema 0 file exactly as the first replay store created it, with two rows.
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(db_path.c_str(), &db) == SQLITE_OK);
    exec_ok(db,
            "PRAGMA journal_mode=WAL;"
            "PRAGMA synchronous=FULL;"
            "CREATE TABLE IF NOT EXISTS variants ("
            "  id INTEGER PRIMARY KEY,"
            "  task_id TEXT NOT NULL, task_name TEXT NOT NULL, hardware TEXT NOT NULL,"
            "  code TEXT NOT NULL, code_hash TEXT NOT NULL,"
            "  status TEXT NOT NULL, correct INTEGER NOT NULL, speedup REAL,"
            "  spread REAL, ref_ms REAL, cand_ms REAL, reward REAL,"
            "  checks_failed TEXT NOT NULL, message TEXT NOT NULL,"
            "  policy_version INTEGER NOT NULL, prompt_id TEXT NOT NULL, group_id INTEGER NOT NULL,"
            "  exemplar_ids TEXT NOT NULL, time_ms INTEGER NOT NULL, count INTEGER NOT NULL,"
            "  UNIQUE (task_id, hardware, code_hash));"
            "INSERT INTO variants VALUES (5, 'level1/19_ReLU', 'ReLU', 'h100', 'code a', 'ha', 'ok',"
            "  1, 1.5, 0.02, 1.0, 0.66, 0.4, '[]', '', 3, 'p-a', 8, '[1]', 1700000000001, 2);"
            "INSERT INTO variants VALUES (9, 'level1/19_ReLU', 'ReLU', 'h100', 'code b', 'hb',"
            "  'rejected', 0, NULL, NULL, NULL, NULL, -1.0, '[\"runtime:timer\",\"static:threads\"]',"
            "  'patched timer', 3, 'p-b', 8, '[]', 1700000000002, 1);");
    CHECK(exec_int(db, "PRAGMA user_version") == 0);
    sqlite3_close(db);
  }
  auto store = replay_store::open(db_path);
  REQUIRE(store.ok());
  CHECK(exec_int(store->handle(), "PRAGMA user_version") == replay_store::schema_version);
  CHECK(exec_text(store->handle(), "PRAGMA integrity_check") == "ok");
  CHECK(*store->count() == 2);
  auto a = store->find(5);
  REQUIRE(a.ok());
  CHECK(a->code == "code a");
  CHECK(a->count == 2);
  CHECK(a->speedup == 1.5);
  CHECK(a->exemplar_ids == "[1]");
  CHECK(a->completion.empty());
  // The new indexes and tables cover the old rows.
  auto ok_rows = store->successful_variants("level1/19_ReLU", "h100");
  REQUIRE(ok_rows.ok());
  REQUIRE(ok_rows->size() == 1);
  CHECK(ok_rows->front().id == 5);
  auto hacks = store->list_hacks({"", "static:threads"});
  REQUIRE(hacks.ok());
  REQUIRE(hacks->size() == 1);
  CHECK(hacks->front().variant.id == 9);
  CHECK(hacks->front().checks == std::vector<std::string>{"runtime:timer", "static:threads"});
  // The upgraded file takes the new columns and tables.
  auto v = sample(1);
  REQUIRE(store->record(v).ok());
  REQUIRE(store->record_prompt("p-1", "text").ok());
  CHECK(store->find(10)->completion == v.completion);

  // Opening again leaves the schema as it is; a file of a newer schema is refused.
  {
    auto again = replay_store::open(db_path);
    REQUIRE(again.ok());
    store = std::move(*again);
  }
  CHECK(*store->count() == 3);
  exec_ok(store->handle(), "PRAGMA user_version = 99");
  auto newer = replay_store::open(db_path);
  REQUIRE_FALSE(newer.ok());
  CHECK(newer.error().code == errc::unsupported);
  CHECK(newer.error().message.find("replay.db") != std::string::npos);
}

TEST_CASE("a store of schema 1 is upgraded to 2 and keeps its whole completions") {
  temp_dir tmp;
  const auto db_path = tmp.path() / "replay.db";
  const auto v = sample(1);
  {
    // A schema 1 file: today's schema less completion_code_at, its row's completion stored whole.
    auto store = replay_store::open(db_path);
    REQUIRE(store.ok());
    sqlite3* db = store->handle();
    exec_ok(db, "DROP TABLE samples; DROP TABLE episode_groups; ALTER TABLE variants DROP COLUMN completion_code_at;"
                " ALTER TABLE variants DROP COLUMN fraction; PRAGMA user_version = 1");
    exec_ok(db, "INSERT INTO variants (id, task_id, task_name, hardware, code, code_hash, status,"
                " correct, speedup, spread, ref_ms, cand_ms, reward, checks_failed, message,"
                " policy_version, prompt_id, group_id, exemplar_ids, time_ms, count, completion)"
                " VALUES (4, 'level1/19_ReLU', 'ReLU', 'h100', 'code a', 'ha', 'ok', 1, 1.5, 0.02, 1.0,"
                " 0.66, 0.4, '[]', '', 3, 'p-a', 8, '[]', 1700000000001, 1,"
                " 'analysis\n```python\ncode a\n```')");
  }
  auto store = replay_store::open(db_path);
  REQUIRE(store.ok());
  CHECK(exec_int(store->handle(), "PRAGMA user_version") == replay_store::schema_version);
  CHECK(exec_text(store->handle(), "PRAGMA integrity_check") == "ok");
  auto old = store->find(4);
  REQUIRE(old.ok());
  CHECK(old->code == "code a");
  CHECK(old->completion == "analysis\n```python\ncode a\n```");
  auto id = store->record(v);
  REQUIRE(id.ok());
  CHECK(store->find(*id)->completion == v.completion);
  CHECK(exec_int(store->handle(), "SELECT completion_code_at IS NOT NULL FROM variants WHERE id = 5") == 1);
}

TEST_CASE("a store of schema 2 is upgraded to the current schema with an empty samples table") {
  temp_dir tmp;
  const auto db_path = tmp.path() / "replay.db";
  {
    auto store = replay_store::open(db_path);
    REQUIRE(store.ok());
    REQUIRE(store->record(sample(1)).ok());
    exec_ok(store->handle(), "DROP TABLE samples; DROP TABLE episode_groups; ALTER TABLE variants DROP COLUMN fraction;"
                             " PRAGMA user_version = 2");
  }
  auto store = replay_store::open(db_path);
  REQUIRE(store.ok());
  CHECK(exec_int(store->handle(), "PRAGMA user_version") == replay_store::schema_version);
  CHECK(*store->count() == 1);
  CHECK(store->count_samples()->total == 0);  // its samples were never kept one by one
  REQUIRE(store->record(sample(2)).ok());
  CHECK(store->count_samples()->pending == 1);
}

// Takes a current store back to schema 5: without its variants' fractions of the limit.
void back_to_schema_5(sqlite3* db) {
  exec_ok(db, "ALTER TABLE variants DROP COLUMN fraction; PRAGMA user_version = 5");
}

// Takes a current store back to schema 4: without what continues an episode.
void back_to_schema_4(sqlite3* db) {
  back_to_schema_5(db);
  exec_ok(db, "ALTER TABLE samples DROP COLUMN context; ALTER TABLE samples DROP COLUMN tokens;"
              " ALTER TABLE samples DROP COLUMN logprobs; ALTER TABLE samples DROP COLUMN verdict;"
              " ALTER TABLE samples DROP COLUMN continues; DROP TABLE episode_groups; PRAGMA user_version = 4");
}

TEST_CASE("a store of schema 3 is upgraded to 4: its samples keep their rows, with no place in an episode") {
  temp_dir tmp;
  const auto db_path = tmp.path() / "replay.db";
  {
    auto store = replay_store::open(db_path);
    REQUIRE(store.ok());
    REQUIRE(store->record(sample(1)).ok());
    // Schema 3 as it was: the samples table without the episode and turn columns.
    back_to_schema_4(store->handle());
    exec_ok(store->handle(), "ALTER TABLE samples DROP COLUMN episode; ALTER TABLE samples DROP COLUMN turn;"
                             " PRAGMA user_version = 3");
  }
  auto store = replay_store::open(db_path);
  REQUIRE(store.ok());
  CHECK(exec_int(store->handle(), "PRAGMA user_version") == replay_store::schema_version);
  auto rows = store->samples(0);
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 1);
  CHECK_FALSE((*rows)[0].episode.has_value());
  CHECK_FALSE((*rows)[0].turn.has_value());
  auto turn = sample(2);
  turn.episode = 1;
  turn.turn = 2;
  REQUIRE(store->record(turn).ok());
  rows = store->samples(0);
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 2);
  CHECK((*rows)[1].episode == std::optional<std::uint32_t>{1});
  CHECK((*rows)[1].turn == std::optional<std::uint32_t>{2});
}

TEST_CASE("a store of schema 4 is upgraded to 5: its samples keep their rows and are never reopened") {
  temp_dir tmp;
  const auto db_path = tmp.path() / "replay.db";
  {
    auto store = replay_store::open(db_path);
    REQUIRE(store.ok());
    auto turn = sample(1);
    turn.episode = 0;
    turn.turn = 0;
    REQUIRE(store->record(turn).ok());
    back_to_schema_4(store->handle());
  }
  auto store = replay_store::open(db_path);
  REQUIRE(store.ok());
  CHECK(exec_int(store->handle(), "PRAGMA user_version") == replay_store::schema_version);
  auto rows = store->samples(0);
  REQUIRE(rows->size() == 1);
  CHECK((*rows)[0].turn == std::optional<std::uint32_t>{0});
  REQUIRE(*store->settle_samples(std::nullopt) == 1);
  CHECK(store->reopen_episode_groups(0, 100, 100)->empty()); // no first prompt, no episode data
  REQUIRE(store->record_episode_group(episode_group(42)).ok());
  CHECK(store->reopen_episode_groups(0, 100, 100)->empty());
}

TEST_CASE("a store of schema 5 is upgraded to 6: its variants keep their rows, with no fraction of the limit") {
  temp_dir tmp;
  const auto db_path = tmp.path() / "replay.db";
  std::int64_t first = 0;
  {
    auto store = replay_store::open(db_path);
    REQUIRE(store.ok());
    auto id = store->record(sample(1));
    REQUIRE(id.ok());
    first = *id;
    back_to_schema_5(store->handle());
  }
  auto store = replay_store::open(db_path);
  REQUIRE(store.ok());
  CHECK(exec_int(store->handle(), "PRAGMA user_version") == 6);
  auto old = store->find(first);
  REQUIRE(old.ok());
  CHECK_FALSE(old->fraction.has_value());
  auto v = sample(2);
  v.fraction = 0.42;
  auto id = store->record(v);
  REQUIRE(id.ok());
  CHECK(store->find(*id)->fraction == std::optional<double>{0.42});
  // The summary rows exemplars are drawn from carry it too.
  auto rows = store->successful_variants(v.task_id, v.hardware, variant_fields::summary);
  REQUIRE(rows.ok());
  bool seen = false;
  for (const auto& r : *rows)
    if (r.id == *id) {
      seen = true;
      CHECK(r.fraction == std::optional<double>{0.42});
    }
  CHECK(seen);
  // An export keeps it (and a row without one has no field), an import reads it back.
  REQUIRE(store->export_jsonl(tmp.path() / "out.jsonl").ok());
  auto copy = replay_store::open(tmp.path() / "copy.db");
  REQUIRE(copy.ok());
  REQUIRE(copy->import_jsonl(tmp.path() / "out.jsonl").ok());
  CHECK(copy->find(*id)->fraction == std::optional<double>{0.42});
  CHECK_FALSE(copy->find(first)->fraction.has_value());
}
