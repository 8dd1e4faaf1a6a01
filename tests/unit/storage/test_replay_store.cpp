// tests/unit/storage/test_replay_store.cpp: replay store round trips, dedup, JSONL export and
// import, a real SIGKILL of a child process in the middle of recording, policy samples and their
// fates, and groups of episodes reopened. Upgrades of older schemas: test_replay_schema.cpp.
#include <doctest/doctest.h>

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fcntl.h>
#include <fstream>
#include <poll.h>
#include <string>
#include <thread>
#include <vector>

#include "core/file_io.hpp"
#include "core/json_parse.hpp"
#include "storage/exemplar_select.hpp"
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
  std::int64_t batch = 1;
  SUBCASE("record") { batch = 1; }
  SUBCASE("record_batch") { batch = 25; }
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
    for (std::int64_t i = 0; i < max_records; i += batch) {
      // Report a record only after record()/record_batch() returned: from then on it is durable.
      std::vector<variant_record> rows;
      for (std::int64_t j = i; j < i + batch; ++j) rows.push_back(sample(static_cast<int>(j)));
      std::vector<std::int64_t> ids;
      if (batch == 1) {
        auto id = store->record(rows[0]);
        if (!id.ok()) ::_exit(11);
        ids.push_back(*id);
      } else {
        auto got = store->record_batch(rows);
        if (!got.ok()) ::_exit(11);
        ids = *got;
      }
      for (std::int64_t j = 0; j < batch; ++j) {
        std::int64_t msg[2] = {i + j, ids[static_cast<std::size_t>(j)]};
        if (::write(fds[1], msg, sizeof msg) != static_cast<ssize_t>(sizeof msg)) ::_exit(12);
      }
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

TEST_CASE("record_batch stores every row in one transaction and returns ids in input order") {
  temp_dir tmp;
  auto store = replay_store::open(tmp.path() / "replay.db");
  REQUIRE(store.ok());
  std::vector<variant_record> rows;
  for (int i = 0; i < 10; ++i) rows.push_back(sample(i));
  rows.push_back(sample(3));  // a repeat inside the batch merges into row 3
  auto ids = store->record_batch(rows);
  REQUIRE(ids.ok());
  REQUIRE(ids->size() == rows.size());
  CHECK((*ids)[10] == (*ids)[3]);
  CHECK(*store->count() == 10);
  for (int i = 0; i < 10; ++i) {
    auto got = store->find((*ids)[static_cast<std::size_t>(i)]);
    REQUIRE(got.ok());
    auto want = sample(i);
    want.id = got->id;
    want.count = i == 3 ? 2 : 1;
    CHECK(*got == want);
  }
  auto none = store->record_batch({});
  REQUIRE(none.ok());
  CHECK(none->empty());
}

TEST_CASE("a failing row rolls the whole batch back") {
  temp_dir tmp;
  auto store = replay_store::open(tmp.path() / "replay.db");
  REQUIRE(store.ok());
  auto kept = store->record(sample(0));
  REQUIRE(kept.ok());

  std::vector<variant_record> rows{sample(1), sample(0), sample(2), sample(3)};  // sample(0): +1 count
  SUBCASE("a row the store refuses (bad exemplar_ids)") {
    rows[2].exemplar_ids = "[\"x\"]";
    auto r = store->record_batch(rows);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == errc::invalid_arg);
    CHECK(r.error().message.find("row 2 of a batch of 4") != std::string::npos);
  }
  SUBCASE("a row SQLite aborts mid-transaction") {
    // A temporary trigger makes the third row fail inside SQLite, after two rows were written.
    exec_ok(store->handle(),
            "CREATE TEMP TRIGGER boom BEFORE INSERT ON main.variants WHEN NEW.task_id = 'boom'"
            " BEGIN SELECT RAISE(ABORT, 'boom'); END");
    rows[2].task_id = "boom";
    auto r = store->record_batch(rows);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == errc::io);
    CHECK(r.error().message.find("boom") != std::string::npos);
    CHECK(r.error().message.find("row 2") != std::string::npos);
  }
  CHECK(*store->count() == 1);
  CHECK(store->find(*kept)->count == 1);  // the merge of row 1 was rolled back too
  CHECK(sqlite3_get_autocommit(store->handle()) != 0);  // no transaction left open
  // The store takes the next batch.
  auto next = store->record_batch(std::vector<variant_record>{sample(5), sample(6)});
  REQUIRE(next.ok());
  CHECK(*store->count() == 3);
}

TEST_CASE("prompts are stored once per id and looked up by id") {
  temp_dir tmp;
  auto store = replay_store::open(tmp.path() / "replay.db");
  REQUIRE(store.ok());
  const std::string text = "<|im_start|>system\nWrite a faster kernel.\n\xE2\x9C\x93<|im_end|>";
  REQUIRE(store->record_prompt("p-1", text).ok());
  auto p = store->find_prompt("p-1");
  REQUIRE(p.ok());
  CHECK(p->prompt_id == "p-1");
  CHECK(p->text == text);
  CHECK(p->created_ms > 1700000000000);

  REQUIRE(store->record_prompt("p-1", text).ok());  // idempotent
  CHECK(store->find_prompt("p-1")->created_ms == p->created_ms);
  CHECK(exec_int(store->handle(), "SELECT COUNT(*) FROM prompts") == 1);

  auto clash = store->record_prompt("p-1", text + " changed");
  REQUIRE_FALSE(clash.ok());
  CHECK(clash.error().code == errc::invalid_arg);
  CHECK(clash.error().message.find("p-1") != std::string::npos);
  CHECK(store->find_prompt("p-1")->text == text);

  CHECK(store->find_prompt("p-2").error().code == errc::not_found);
  CHECK(store->record_prompt("", "x").error().code == errc::invalid_arg);
}

TEST_CASE("prompts and completions survive export and import") {
  temp_dir tmp;
  const auto jsonl = tmp.path() / "replay.jsonl";
  {
    auto store = replay_store::open(tmp.path() / "a.db");
    REQUIRE(store.ok());
    REQUIRE(store->record_prompt("p-1", "prompt one\n\"quoted\"").ok());
    REQUIRE(store->record(sample(1)).ok());
    REQUIRE(store->export_jsonl(jsonl).ok());
  }
  auto fresh = replay_store::open(tmp.path() / "b.db");
  REQUIRE(fresh.ok());
  auto n = fresh->import_jsonl(jsonl);
  REQUIRE(n.ok());
  CHECK(*n == 2);
  CHECK(fresh->find_prompt("p-1")->text == "prompt one\n\"quoted\"");
  CHECK(fresh->find(1)->completion == sample(1).completion);

  SUBCASE("a line of the previous format, without completion, imports with an empty one") {
    std::string text = *read_file(jsonl);
    auto line = text.substr(text.find('\n') + 1);
    auto k = line.find(",\"completion\":");
    REQUIRE(k != std::string::npos);
    line = line.substr(0, k) + "}\n";
    auto c = line.find("\"code_hash\":\"hash-1\"");
    REQUIRE(c != std::string::npos);
    line.replace(c, 20, "\"code_hash\":\"hash-9\"");
    std::ofstream(tmp.path() / "old.jsonl") << line;
    REQUIRE(fresh->import_jsonl(tmp.path() / "old.jsonl").ok());
    CHECK(fresh->count().value() == 2);
    auto rows = fresh->successful_variants("level1/19_ReLU", "h100", variant_fields::full);
    REQUIRE(rows.ok());
    REQUIRE(rows->size() == 2);
    CHECK(((*rows)[0].completion.empty() || (*rows)[1].completion.empty()));
  }
  SUBCASE("a prompt line whose id holds another text refuses the whole import") {
    REQUIRE(fresh->record_prompt("p-2", "x").ok());
    std::ofstream(tmp.path() / "clash.jsonl")
      << R"({"kind":"prompt","prompt_id":"p-3","text":"y","created_ms":1})" << "\n"
      << R"({"kind":"prompt","prompt_id":"p-2","text":"not x","created_ms":1})" << "\n";
    auto r = fresh->import_jsonl(tmp.path() / "clash.jsonl");
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("clash.jsonl:2:") != std::string::npos);
    CHECK(fresh->find_prompt("p-3").error().code == errc::not_found);
  }
}

TEST_CASE("successful_variants returns one task and hardware's successful rows from a covering index") {
  temp_dir tmp;
  auto store = replay_store::open(tmp.path() / "replay.db");
  REQUIRE(store.ok());
  std::vector<variant_record> rows;
  for (int i = 0; i < 12; ++i) {
    auto v = sample(i);
    v.reward = 3.0 - 0.25 * i;  // descending, so the reward order differs from id order
    if (i % 4 == 1) v.hardware = "l40";
    if (i == 2) v.status = "incorrect", v.correct = false, v.speedup.reset();
    if (i == 4) v.correct = false;
    if (i == 6) v.speedup.reset();
    if (i == 8) v.reward = std::numeric_limits<double>::infinity();  // stored NULL
    if (i == 10) v.task_id = "level1/20_LeakyReLU";
    rows.push_back(v);
  }
  REQUIRE(store->record_batch(rows).ok());
  auto summary = store->successful_variants("level1/19_ReLU", "h100");
  auto full = store->successful_variants("level1/19_ReLU", "h100", variant_fields::full);
  REQUIRE(summary.ok());
  REQUIRE(full.ok());
  // h100, ReLU: 0 3 7 11 are successful (1 5 9: l40; 2 4 6 8: failed or no reward; 10: other task).
  std::vector<std::string> want{"hash-11", "hash-7", "hash-3", "hash-0"};  // reward ascending
  REQUIRE(summary->size() == want.size());
  REQUIRE(full->size() == want.size());
  for (std::size_t k = 0; k < want.size(); ++k) {
    const auto& s = (*summary)[k];
    const auto& f = (*full)[k];
    CHECK(s.code_hash == want[k]);
    CHECK(f.code_hash == want[k]);
    CHECK(s.id == f.id);
    CHECK(s.speedup == f.speedup);
    CHECK(s.reward == f.reward);
    CHECK(s.task_id == f.task_id);
    CHECK(s.hardware == f.hardware);
    CHECK(is_successful(s));
    CHECK(s.code.empty());
    CHECK(!f.code.empty());
  }
  CHECK(store->successful_variants("level1/19_ReLU", "l40")->size() == 3);
  CHECK(store->successful_variants("nope", "h100")->empty());

  // The query plan reads the partial covering index only.
  std::string plan;
  sqlite3_stmt* s = nullptr;
  REQUIRE(sqlite3_prepare_v2(store->handle(),
                             "EXPLAIN QUERY PLAN SELECT id, code_hash, speedup, reward FROM variants"
                             " WHERE task_id = ?1 AND hardware = ?2 AND status = 'ok' AND correct = 1"
                             " AND speedup IS NOT NULL AND reward IS NOT NULL"
                             " ORDER BY reward, code_hash",
                             -1, &s, nullptr) == SQLITE_OK);
  while (sqlite3_step(s) == SQLITE_ROW) plan += reinterpret_cast<const char*>(sqlite3_column_text(s, 3));
  sqlite3_finalize(s);
  CHECK(plan.find("COVERING INDEX variants_successful") != std::string::npos);
  CHECK(plan.find("TEMP B-TREE") == std::string::npos);  // no sort step

  // The summary rows feed select_exemplars directly.
  std::mt19937_64 rng(7);
  exemplar_options opts;
  opts.n = 2;
  auto picked = select_exemplars(*summary, opts, rng);
  REQUIRE(picked.ok());
  CHECK(picked->size() == 2);
}

TEST_CASE("export_sft_jsonl writes the verified variants with their stored prompt and completion") {
  temp_dir tmp;
  auto store = replay_store::open(tmp.path() / "replay.db");
  REQUIRE(store.ok());
  REQUIRE(store->record_prompt("p-1", "prompt one").ok());
  REQUIRE(store->record_prompt("p-2", "prompt two").ok());
  std::vector<variant_record> rows;
  auto add = [&](int i, const char* prompt, double speedup, auto&& edit) {
    auto v = sample(i);
    v.prompt_id = prompt;
    v.speedup = speedup;
    edit(v);
    rows.push_back(v);
  };
  auto same = [](variant_record&) {};
  add(0, "p-1", 2.0, same);                                                 // written
  add(1, "p-2", 1.6, [](variant_record& v) {                                // written (no filter),
    v.hardware = "l40";                                                     // turn 1 of an episode
    v.episode = 3;
    v.turn = 1;
  });
  add(2, "p-1", 1.2, same);                                                 // below the bar
  add(3, "p-9", 3.0, same);                                                 // skipped: no prompt
  add(4, "p-1", 3.0, [](variant_record& v) { v.completion.clear(); });      // skipped: no completion
  add(5, "p-1", 3.0, [](variant_record& v) { v.correct = false; });         // not verified
  add(6, "p-1", 3.0, [](variant_record& v) { v.status = "rejected"; });     // not verified
  REQUIRE(store->record_batch(rows).ok());

  const auto out = tmp.path() / "sft.jsonl";
  sft_options opts;
  opts.min_speedup = 1.5;
  auto stats = store->export_sft_jsonl(out, opts);
  REQUIRE(stats.ok());
  CHECK(stats->written == 2);
  CHECK(stats->skipped == 2);
  auto text = read_file(out);
  REQUIRE(text.ok());
  std::vector<json_value> lines;
  std::string_view rest = *text;
  while (!rest.empty()) {
    auto nl = rest.find('\n');
    REQUIRE(nl != std::string_view::npos);
    auto j = parse_json(rest.substr(0, nl));
    REQUIRE(j.ok());
    lines.push_back(*j);
    rest.remove_prefix(nl + 1);
  }
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].find("prompt")->as_string() == "prompt one");
  CHECK(lines[0].find("completion")->as_string() == sample(0).completion);
  CHECK(lines[0].find("task")->as_string() == "level1/19_ReLU");
  CHECK(lines[0].find("speedup")->as_double() == 2.0);
  CHECK(lines[0].find("hardware")->as_string() == "h100");
  CHECK(lines[0].find("variant_id")->as_int() == 1);
  CHECK(lines[0].find("turn") == nullptr); // a one-turn sample
  CHECK(lines[1].find("prompt")->as_string() == "prompt two");
  CHECK(lines[1].find("hardware")->as_string() == "l40");
  REQUIRE(lines[1].find("turn") != nullptr);
  CHECK(lines[1].find("turn")->as_int() == 1);
  // The sample row keeps the place in its episode.
  auto rows1 = store->samples(42);
  REQUIRE(rows1.ok());
  std::size_t placed = 0;
  for (const auto& r : *rows1)
    if (r.episode) {
      CHECK(*r.episode == 3);
      CHECK(r.turn == std::optional<std::uint32_t>{1});
      ++placed;
    }
  CHECK(placed == 1);

  opts.hardware = "l40";
  stats = store->export_sft_jsonl(out, opts);
  REQUIRE(stats.ok());
  CHECK(stats->written == 1);
  CHECK(stats->skipped == 0);
  CHECK(read_file(out)->find("prompt two") != std::string::npos);
}

TEST_CASE("a completion is stored without its code block and read back whole") {
  temp_dir tmp;
  auto store = replay_store::open(tmp.path() / "replay.db");
  REQUIRE(store.ok());
  sqlite3* db = store->handle();
  // The code occurs twice: the last occurrence (the final code block) is the one cut out.
  auto twice = sample(1);
  twice.completion = "draft:\n" + twice.code + "\n## Code Implementation\n```python\n" + twice.code + "\n```\n";
  auto absent = sample(2);
  absent.completion = "## Code Implementation\n```python\n    indented, not the code\n```";
  auto only_code = sample(3);
  only_code.completion = only_code.code;
  auto no_completion = sample(4);
  no_completion.completion.clear();
  auto empty_code = sample(5);
  empty_code.code.clear();
  for (const auto* v : {&twice, &absent, &only_code, &no_completion, &empty_code}) {
    auto id = store->record(*v);
    REQUIRE(id.ok());
    auto back = store->find(*id);
    REQUIRE(back.ok());
    CHECK(back->completion == v->completion);
    CHECK(back->code == v->code);
  }
  CHECK(exec_text(db, "SELECT completion FROM variants WHERE id = 1") ==
        "draft:\n" + twice.code + "\n## Code Implementation\n```python\n\n```\n");
  CHECK(exec_int(db, "SELECT completion_code_at FROM variants WHERE id = 1") ==
        static_cast<std::int64_t>(twice.completion.rfind(twice.code)));
  CHECK(exec_int(db, "SELECT completion_code_at IS NULL FROM variants WHERE id = 2") == 1);
  CHECK(exec_int(db, "SELECT length(completion) FROM variants WHERE id = 3") == 0);
  CHECK(exec_int(db, "SELECT completion_code_at FROM variants WHERE id = 3") == 0);
  CHECK(exec_int(db, "SELECT completion_code_at IS NULL FROM variants WHERE id = 4") == 1);
  CHECK(exec_int(db, "SELECT completion_code_at IS NULL FROM variants WHERE id = 5") == 1);

  // A better repeat replaces code and completion together; a worse one neither.
  auto better = twice;
  better.code += "\n# tuned";
  better.completion = "## Code Implementation\n```python\n" + better.code + "\n```";
  better.reward += 1.0;
  REQUIRE(store->record(better).ok());
  auto worse = twice;
  worse.code += "\n# slower";
  worse.completion = "short: " + worse.code;
  worse.reward -= 5.0;
  REQUIRE(store->record(worse).ok());
  auto row = store->find(1);
  REQUIRE(row.ok());
  CHECK(row->code == better.code);
  CHECK(row->completion == better.completion);
  CHECK(row->count == 3);

  // The SFT export and the JSONL round trip see whole completions.
  REQUIRE(store->record_prompt(twice.prompt_id, "prompt text").ok());
  auto sft = store->export_sft_jsonl(tmp.path() / "sft.jsonl", {0.0, ""});
  REQUIRE(sft.ok());
  auto text = read_file(tmp.path() / "sft.jsonl");
  REQUIRE(text.ok());
  auto line = parse_json(text->substr(0, text->find('\n')));
  REQUIRE(line.ok());
  CHECK(line->find("completion")->as_string() == better.completion);
  REQUIRE(store->export_jsonl(tmp.path() / "all.jsonl").ok());
  auto fresh = replay_store::open(tmp.path() / "fresh.db");
  REQUIRE(fresh.ok());
  REQUIRE(fresh->import_jsonl(tmp.path() / "all.jsonl").ok());
  for (std::int64_t id = 1; id <= 5; ++id) CHECK(fresh->find(id)->completion == store->find(id)->completion);
  CHECK(exec_int(fresh->handle(), "SELECT completion_code_at FROM variants WHERE id = 1") ==
        exec_int(db, "SELECT completion_code_at FROM variants WHERE id = 1"));
}

TEST_CASE("the WAL is copied into the database file by the store's own thread and stays bounded") {
  temp_dir tmp;
  const auto db_path = tmp.path() / "replay.db";
  auto store = replay_store::open(db_path);
  REQUIRE(store.ok());
  // Rows of 64 KB of code: 16 per batch is 1 MiB, about 260 WAL pages of 4 KiB.
  int next = 0;
  auto batch = [&] {
    std::vector<variant_record> rows;
    for (int i = 0; i < 16; ++i, ++next) {
      auto v = sample(next);
      v.code = std::string(64 * 1024, static_cast<char>('a' + next % 26)) + std::to_string(next);
      v.completion.clear();
      rows.push_back(std::move(v));
    }
    REQUIRE(store->record_batch(rows).ok());
  };
  // 5 MiB: past the 1000 pages that wake the checkpointer, far below the 8000 from which the
  // recording thread would checkpoint itself. With no further commit, the database file must
  // receive the pages from the checkpointer's thread.
  for (int b = 0; b < 5; ++b) batch();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::filesystem::file_size(db_path) < 4u * 1024 * 1024 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polls the file; no ordering assumed
  CHECK(std::filesystem::file_size(db_path) >= 4u * 1024 * 1024);

  // 40 MiB more: the WAL is restarted after its checkpoints instead of growing with the data
  // (bound: the 8000-page backstop plus a batch before it and one after, in WAL frames of
  // 4096 + 24 bytes).
  std::uintmax_t largest_wal = 0;
  const auto wal = tmp.path() / "replay.db-wal";
  for (int b = 0; b < 40; ++b) {
    batch();
    largest_wal = std::max(largest_wal, std::filesystem::file_size(wal));
  }
  CHECK(largest_wal <= (8000u + 2 * 300u) * (4096u + 24u));
  CHECK(*store->count() == next);
  CHECK(exec_text(store->handle(), "PRAGMA integrity_check") == "ok");
  auto last = store->find(next);
  REQUIRE(last.ok());
  CHECK(last->code.size() == 64 * 1024 + std::to_string(next - 1).size());
}

TEST_CASE("a store damaged past its first pages is refused at open, naming the file, not when a query reaches the damage") {
  temp_dir tmp;
  const auto path = tmp.path() / "replay.db";
  {
    auto store = replay_store::open(path);
    REQUIRE(store.ok());
    std::vector<variant_record> rows;
    for (int i = 0; i < 400; ++i)
      rows.push_back(sample(i));
    REQUIRE(store->record_batch(rows).ok());
  } // the last connection's close moves the WAL into the file
  REQUIRE_FALSE(std::filesystem::exists(tmp.path() / "replay.db-wal"));
  const auto size = std::filesystem::file_size(path);
  REQUIRE(size > 16 * 4096);
  {
    // The first page (header and schema) stays intact; pages from the middle on are garbage.
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    std::string junk(size / 2, '\x5a');
    f.seekp(static_cast<std::streamoff>(size / 3));
    f.write(junk.data(), static_cast<std::streamsize>(size - size / 3));
  }
  auto again = replay_store::open(path);
  REQUIRE_FALSE(again.ok());
  CHECK(again.error().code == errc::corrupt);
  CHECK(again.error().message.find(path.string()) != std::string::npos);
  CHECK(again.error().message.find("damaged") != std::string::npos);
  MESSAGE(again.error().message);
}

TEST_CASE("every policy sample gets a row of its own with its completion, and its fate once") {
  temp_dir tmp;
  auto store = replay_store::open(tmp.path() / "replay.db");
  REQUIRE(store.ok());
  auto a = sample(1);
  auto b = sample(1);  // the same code from another sample of the group: one variant row, two samples
  b.completion = "another response\n```python\n" + b.code + "\n```";
  b.policy_version = 8;
  auto seed = sample(2);
  seed.group_id = 0;  // a seed variant: no sample row
  auto late = sample(3);
  late.group_id = 43;
  late.sample_fate = std::string(sample_fate::orphan);
  for (const auto& v : {a, b, seed, late}) REQUIRE(store->record(v).ok());
  CHECK(*store->count() == 3);
  CHECK(store->find(1)->count == 2);
  auto rows = store->samples(42);
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 2);
  CHECK((*rows)[0].variant_id == 1);
  CHECK((*rows)[1].variant_id == 1);
  CHECK((*rows)[0].completion == a.completion);
  CHECK((*rows)[1].completion == b.completion);
  CHECK((*rows)[1].policy_version == 8);
  CHECK((*rows)[0].prompt_id == a.prompt_id);
  CHECK((*rows)[0].fate.empty());
  auto counts = store->count_samples();
  REQUIRE(counts.ok());
  CHECK(counts->total == 3);
  CHECK(counts->pending == 2);
  CHECK(counts->orphan == 1);
  CHECK(counts->text() == "3 samples: 1 orphan, 2 undecided");

  // A fate is set once: the group's undecided samples only.
  CHECK(*store->set_group_fate(42, sample_fate::trained, 5, 3) == 2);
  CHECK(*store->set_group_fate(42, sample_fate::stale, 6, 4) == 0);
  rows = store->samples(42);
  CHECK((*rows)[0].fate == "trained");
  CHECK((*rows)[0].fate_step == 5);
  CHECK((*rows)[0].fate_seq == std::optional<std::int64_t>(3));
  CHECK(store->set_group_fate(42, "eaten", 1).error().code == errc::invalid_arg);
  CHECK(store->set_group_fate(0, sample_fate::stale, 1).error().code == errc::invalid_arg);
  auto bad = sample(4);
  bad.sample_fate = "eaten";
  CHECK(store->record(bad).error().code == errc::invalid_arg);
  CHECK(*store->count() == 3);  // the variant's row went back with its sample's

  // A resume from the checkpoint that counted fates up to 2: fate 3 came after it, and the
  // undecided samples of groups in flight never reached the trainer.
  auto c = sample(5);
  c.group_id = 44;
  REQUIRE(store->record(c).ok());
  CHECK(*store->settle_samples(2) == 3);
  counts = store->count_samples();
  CHECK(counts->unfinished == 3);
  CHECK(counts->orphan == 1);
  CHECK(counts->pending == 0);
  CHECK(counts->trained == 0);
  // Settled fates stay settled; a pause settles what is undecided only.
  auto d = sample(6);
  d.group_id = 45;
  REQUIRE(store->record(d).ok());
  REQUIRE(*store->set_group_fate(45, sample_fate::discarded, 7, 9) == 1);
  CHECK(*store->settle_samples(std::nullopt) == 0);
  CHECK(store->count_samples()->discarded == 1);
  CHECK(store->count_samples()->total == 5);
}

namespace {

// Turn `turn` of episode `episode` of group `group`, sampled at `version`, with its episode data.
variant_record episode_turn(std::uint64_t group, std::uint32_t episode, std::uint32_t turn, std::uint64_t version,
                            bool continues, const std::string& fate = "") {
  auto v = sample(static_cast<int>(group * 100 + episode * 10 + turn));
  v.group_id = group;
  v.policy_version = version;
  v.episode = episode;
  v.turn = turn;
  v.sample_fate = fate;
  episode_turn_data d;
  if (turn > 0) d.context = {1, 2, 3, static_cast<std::int32_t>(turn)};
  d.tokens = {static_cast<std::int32_t>(episode), static_cast<std::int32_t>(turn), -7};
  d.logprobs = {-0.5f, -1.25f, -3.0f};
  d.verdict = R"({"status":"ok","correct":true})";
  d.continues = continues;
  v.episode_data = d;
  return v;
}

} // namespace

TEST_CASE("groups of episodes whose samples never reached a trainer are reopened with their turns, once each") {
  temp_dir tmp;
  auto store = replay_store::open(tmp.path() / "replay.db");
  REQUIRE(store.ok());
  CHECK(*store->max_group_id() == 0);
  // Group 7: episode 0 went on after turn 0 and turn 1 is stored; episode 1 ended at turn 0.
  for (std::uint64_t g : {7, 8, 9, 10, 11, 12}) {
    REQUIRE(store->record_prompt("p-" + std::to_string(g), "prompt text " + std::to_string(g)).ok());
    REQUIRE(store->record_episode_group(episode_group(g)).ok());
  }
  for (const auto& v : {episode_turn(7, 0, 0, 5, true), episode_turn(7, 0, 1, 6, true), episode_turn(7, 1, 0, 5, false),
                        // 8: trained already.
                        episode_turn(8, 0, 0, 5, false),
                        // 9: sampled at version 2, too old for the window.
                        episode_turn(9, 0, 0, 2, true),
                        // 10: its turn 1 without turn 0 (a gap).
                        episode_turn(10, 0, 1, 5, false),
                        // 11: sampled after the checkpoint's version 6 (weights that are gone).
                        episode_turn(11, 0, 0, 7, true),
                        // 12: its turn 0 says the episode ended, yet a turn 1 follows.
                        episode_turn(12, 0, 0, 5, false), episode_turn(12, 0, 1, 5, false)})
    REQUIRE(store->record(v).ok());
  auto plain = sample(1);
  plain.group_id = 13; // a one-turn group: no episode data, never reopened
  REQUIRE(store->record(plain).ok());
  REQUIRE(*store->set_group_fate(8, sample_fate::trained, 3, 1) == 1);
  CHECK(*store->max_group_id() == 13);
  // Not before a settle: undecided samples belong to a process still running.
  CHECK(store->reopen_episode_groups(4, 6, 100)->empty());
  REQUIRE(*store->settle_samples(std::nullopt) == 9);
  // A limit of none reopens nothing.
  CHECK(store->reopen_episode_groups(4, 6, 0)->empty());
  auto r = store->reopen_episode_groups(4, 6, 100);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 1);
  const auto& g = r->front();
  CHECK(g.group == episode_group(7));
  CHECK(g.prompt == "prompt text 7");
  REQUIRE(g.turns.size() == 3);
  CHECK(g.turns[0].episode == 0);
  CHECK(g.turns[0].turn == 0);
  CHECK(g.turns[1].turn == 1);
  CHECK(g.turns[2].episode == 1);
  CHECK(g.turns[0].data == *episode_turn(7, 0, 0, 5, true).episode_data);
  CHECK(g.turns[1].data == *episode_turn(7, 0, 1, 6, true).episode_data);
  CHECK(g.turns[1].policy_version == 6);
  CHECK(g.turns[1].completion == episode_turn(7, 0, 1, 6, true).completion);
  // Its samples are undecided again: their fate is the group's next one.
  auto counts = store->count_samples();
  CHECK(counts->pending == 3);
  CHECK(counts->unfinished == 6);
  CHECK(*store->set_group_fate(7, sample_fate::trained, 9, 2) == 3);
  // Once is all: a second reopen finds nothing more (the others fail a condition).
  // Groups 9 and 11 inside a wider window.
  auto wider = store->reopen_episode_groups(0, 100, 100);
  REQUIRE(wider->size() == 2);
  CHECK(wider->front().group.group_id == 9);
  CHECK(wider->back().group.group_id == 11);
  CHECK(store->reopen_episode_groups(0, 100, 100)->empty());
  CHECK(store->record_episode_group(episode_group(0)).error().code == errc::invalid_arg);
  auto bad = episode_group(14);
  bad.exemplar_ids = "[\"x\"]";
  CHECK(store->record_episode_group(bad).error().message.find("exemplar_ids") != std::string::npos);
}
