// tests/unit/storage/test_replay_store.cpp: replay store round trips, dedup, JSONL export and
// import, and a real SIGKILL of a child process in the middle of recording.
#include <doctest/doctest.h>

#include <sqlite3.h>

#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <poll.h>
#include <string>
#include <vector>

#include "storage/replay_store.hpp"
#include "storage_test_util.hpp"

using namespace crucible;
using namespace crucible::storage;
using crucible::testing::temp_dir;

namespace {

variant_record sample(int i) {
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
  return v;
}

std::string exec_text(sqlite3* db, const char* sql) {
  sqlite3_stmt* s = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, sql, -1, &s, nullptr) == SQLITE_OK);
  std::string out;
  if (sqlite3_step(s) == SQLITE_ROW) out = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
  sqlite3_finalize(s);
  return out;
}

} // namespace

TEST_CASE("record then find returns the same fields, in WAL mode") {
  temp_dir tmp;
  auto store = replay_store::open(tmp.path() / "replay.db");
  REQUIRE(store.ok());
  CHECK(exec_text(store->handle(), "PRAGMA journal_mode") == "wal");
  CHECK(exec_text(store->handle(), "PRAGMA synchronous") == "2");  // FULL

  auto a = sample(1);
  auto b = sample(2);
  b.speedup.reset();
  b.correct = false;
  b.status = "compile_error";
  b.checks_failed = "[ ]";  // stored canonically
  b.exemplar_ids = "[]";
  auto ia = store->record(a);
  auto ib = store->record(b);
  REQUIRE(ia.ok());
  REQUIRE(ib.ok());
  CHECK(*ia != *ib);
  CHECK(*store->count() == 2);

  auto fa = store->find(*ia);
  REQUIRE(fa.ok());
  a.id = *ia;
  CHECK(*fa == a);

  auto fb = store->find(*ib);
  REQUIRE(fb.ok());
  CHECK_FALSE(fb->speedup.has_value());
  CHECK(fb->status == "compile_error");
  CHECK(fb->checks_failed == "[]");
  CHECK(fb->count == 1);

  auto missing = store->find(9999);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().code == errc::not_found);
  CHECK(missing.error().message.find("replay.db") != std::string::npos);

  auto bad = sample(3);
  bad.exemplar_ids = R"(["x"])";
  auto rb = store->record(bad);
  REQUIRE_FALSE(rb.ok());
  CHECK(rb.error().code == errc::invalid_arg);
  CHECK(*store->count() == 2);
}

TEST_CASE("the same normalised code for a task and hardware is stored once, with a count") {
  temp_dir tmp;
  auto store = replay_store::open(tmp.path() / "replay.db");
  REQUIRE(store.ok());
  auto first = sample(1);
  auto id1 = store->record(first);
  REQUIRE(id1.ok());

  auto worse = first;  // same hash, lower reward: counted, verdict kept
  worse.code = "// reformatted\n" + first.code;
  worse.reward = 0.0;
  worse.status = "timeout";
  auto id2 = store->record(worse);
  REQUIRE(id2.ok());
  CHECK(*id2 == *id1);
  CHECK(*store->count() == 1);
  auto row = store->find(*id1);
  REQUIRE(row.ok());
  CHECK(row->count == 2);
  CHECK(row->status == "ok");
  CHECK(row->code == first.code);

  auto better = first;  // higher reward: verdict replaced
  better.reward = 5.0;
  better.policy_version = 9;
  REQUIRE(*store->record(better) == *id1);
  row = store->find(*id1);
  CHECK(row->count == 3);
  CHECK(row->reward == 5.0);
  CHECK(row->policy_version == 9);

  auto other_hw = first;  // other hardware: a row of its own
  other_hw.hardware = "h200";
  auto id3 = store->record(other_hw);
  REQUIRE(id3.ok());
  CHECK(*id3 != *id1);
  CHECK(*store->count() == 2);
}

TEST_CASE("export then import into a fresh store gives the same rows") {
  temp_dir tmp;
  const auto jsonl = tmp.path() / "replay.jsonl";
  std::vector<variant_record> rows;
  {
    auto store = replay_store::open(tmp.path() / "a.db");
    REQUIRE(store.ok());
    for (int i = 0; i < 5; ++i) {
      auto v = sample(i);
      if (i == 3) v.speedup.reset();
      REQUIRE(store->record(v).ok());
    }
    REQUIRE(store->record(sample(2)).ok());  // a count of 2
    for (int i = 1; i <= 5; ++i) rows.push_back(*store->find(i));
    REQUIRE(store->export_jsonl(jsonl).ok());
  }
  CHECK(rows[2].count == 2);
  auto fresh = replay_store::open(tmp.path() / "b.db");
  REQUIRE(fresh.ok());
  auto n = fresh->import_jsonl(jsonl);
  REQUIRE(n.ok());
  CHECK(*n == 5);
  CHECK(*fresh->count() == 5);
  for (const auto& r : rows) {
    auto got = fresh->find(r.id);
    REQUIRE(got.ok());
    CHECK(*got == r);
  }
  // Exporting the copy gives the same bytes.
  REQUIRE(fresh->export_jsonl(tmp.path() / "again.jsonl").ok());
  std::ifstream f1(jsonl), f2(tmp.path() / "again.jsonl");
  std::string s1((std::istreambuf_iterator<char>(f1)), {}), s2((std::istreambuf_iterator<char>(f2)), {});
  CHECK(s1 == s2);
  CHECK(!s1.empty());
}

TEST_CASE("a malformed JSONL line is refused with its line number and nothing is imported") {
  temp_dir tmp;
  const auto jsonl = tmp.path() / "replay.jsonl";
  {
    auto store = replay_store::open(tmp.path() / "a.db");
    REQUIRE(store.ok());
    for (int i = 0; i < 3; ++i) REQUIRE(store->record(sample(i)).ok());
    REQUIRE(store->export_jsonl(jsonl).ok());
  }
  std::string text;
  {
    std::ifstream in(jsonl);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto cut = [&](const std::string& third) {
    // lines 1-2 valid, line 3 replaced
    auto p1 = text.find('\n');
    auto p2 = text.find('\n', p1 + 1);
    std::ofstream out(jsonl, std::ios::trunc);
    out << text.substr(0, p2 + 1) << third << "\n";
  };

  SUBCASE("broken JSON") { cut(R"({"id":3,"task_id":)"); }
  SUBCASE("missing field") {
    auto p2 = text.find('\n', text.find('\n') + 1);
    std::string line3 = text.substr(p2 + 1);
    line3 = line3.substr(0, line3.find('\n'));
    auto k = line3.find(R"("hardware":)");
    REQUIRE(k != std::string::npos);
    line3.replace(k, 11, R"("hardwire":)");
    cut(line3);
  }

  auto fresh = replay_store::open(tmp.path() / "b.db");
  REQUIRE(fresh.ok());
  auto r = fresh->import_jsonl(jsonl);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::corrupt);
  CHECK(r.error().message.find(jsonl.string() + ":3:") != std::string::npos);
  CHECK(*fresh->count() == 0);
}

TEST_CASE("a SIGKILLed recorder leaves an intact store holding every returned record") {
  temp_dir tmp;
  const auto db = tmp.path() / "replay.db";
  constexpr int min_reported = 200;
  constexpr int max_records = 100000;
  int fds[2];
  REQUIRE(::pipe(fds) == 0);

  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    test::die_with_parent();
    ::close(fds[0]);
    auto store = replay_store::open(db);
    if (!store.ok()) ::_exit(10);
    for (std::int64_t i = 0; i < max_records; ++i) {
      auto id = store->record(sample(static_cast<int>(i)));
      if (!id.ok()) ::_exit(11);
      std::int64_t msg[2] = {i, *id};
      if (::write(fds[1], msg, sizeof msg) != static_cast<ssize_t>(sizeof msg)) ::_exit(12);
    }
    for (;;) ::pause();
  }
  ::close(fds[1]);
  test::child_guard child(pid);

  std::string buf;
  auto read_some = [&](int timeout_ms) {
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    char tmpb[4096];
    auto n = ::read(fds[0], tmpb, sizeof tmpb);
    if (n <= 0) return false;
    buf.append(tmpb, static_cast<std::size_t>(n));
    return true;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (buf.size() < min_reported * 16 && std::chrono::steady_clock::now() < deadline) {
    if (!read_some(1000)) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        child.reaped(st);
        FAIL("child exited early with status ", st);
      }
    }
  }
  int status = child.kill_and_wait();
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  while (read_some(0)) {}  // drain what was reported before the kill
  ::close(fds[0]);
  const std::size_t reported = buf.size() / 16;
  REQUIRE(reported >= static_cast<std::size_t>(min_reported));

  auto store = replay_store::open(db);
  REQUIRE(store.ok());
  CHECK(exec_text(store->handle(), "PRAGMA integrity_check") == "ok");
  CHECK(*store->count() >= static_cast<std::int64_t>(reported));
  for (std::size_t k = 0; k < reported; ++k) {
    std::int64_t msg[2];
    std::memcpy(msg, buf.data() + k * 16, sizeof msg);
    auto row = store->find(msg[1]);
    if (!row.ok()) FAIL("record ", msg[0], " (id ", msg[1], ") is missing");
    if (row->code != sample(static_cast<int>(msg[0])).code)
      FAIL("id ", msg[1], " holds the wrong code");
  }
  REQUIRE(store->record(sample(max_records + 1)).ok());  // the store still takes writes
}
