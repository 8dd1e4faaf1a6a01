// tests/unit/storage/test_run_dir.cpp: run directory creation, validation and its run.lock,
// held across processes by a forked child that is then SIGKILLed.
#include <doctest/doctest.h>

#include <csignal>
#include <string>

#include "storage/atomic_file.hpp"
#include "storage/run_dir.hpp"
#include "storage_test_util.hpp"

using namespace crucible;
using namespace crucible::storage;
using crucible::storage::test::entry_count;
using crucible::storage::test::temp_dir;

namespace {

std::string trimmed_file(const std::filesystem::path& path) {
  auto r = read_file(path);
  REQUIRE(r.ok());
  std::string s = *r;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

} // namespace

TEST_CASE("create makes the run directory with checkpoints/ and holds its lock") {
  temp_dir tmp;
  const auto root = tmp.path() / "runs";  // created on demand
  {
    auto run = run_directory::create(root, "exp1");
    REQUIRE(run.ok());
    CHECK(run->path() == root / "exp1");
    CHECK(std::filesystem::is_directory(run->checkpoints_dir()));
    CHECK(run->config_file() == root / "exp1" / "config.yaml");
    CHECK(run->metrics_file() == root / "exp1" / "metrics.jsonl");
    CHECK(run->replay_db() == root / "exp1" / "replay.db");
    CHECK(run->events_log() == root / "exp1" / "events.log");
    CHECK(run->status_file() == root / "exp1" / "status.json");
    CHECK(trimmed_file(root / "exp1" / "run.lock") == std::to_string(::getpid()));
    CHECK(run_directory_locked(run->path()));
  }
  CHECK_FALSE(run_directory_locked(root / "exp1"));  // the destructor released it
}

TEST_CASE("create rejects names that are not a single directory name") {
  temp_dir tmp;
  for (const char* bad : {"", ".", "..", "a/b", "/abs", "../escape"}) {
    CAPTURE(bad);
    auto run = run_directory::create(tmp.path(), bad);
    REQUIRE_FALSE(run.ok());
    CHECK(run.error().code == errc::invalid_arg);
  }
  auto nul = run_directory::create(tmp.path(), std::string("a\0b", 3));
  REQUIRE_FALSE(nul.ok());
  CHECK(nul.error().code == errc::invalid_arg);
  CHECK(entry_count(tmp.path()) == 0);  // nothing was created for any of them
}

TEST_CASE("create refuses a directory that already holds a run unless allowed") {
  temp_dir tmp;
  {
    auto first = run_directory::create(tmp.path(), "exp");
    REQUIRE(first.ok());
    REQUIRE(write_file_atomic(first->config_file(), "seed: 1\n").ok());
  }
  auto again = run_directory::create(tmp.path(), "exp");
  REQUIRE_FALSE(again.ok());
  CHECK(again.error().code == errc::invalid_arg);
  CHECK(contains(again.error().message, (tmp.path() / "exp").string()));
  CHECK_FALSE(run_directory_locked(tmp.path() / "exp"));  // the refusal released the lock

  auto allowed = run_directory::create(tmp.path(), "exp", /*allow_existing=*/true);
  REQUIRE(allowed.ok());
  CHECK(*read_file(allowed->config_file()) == "seed: 1\n");

  // A directory without config.yaml is not a run yet, so create may take it over.
  std::filesystem::create_directories(tmp.path() / "empty");
  CHECK(run_directory::create(tmp.path(), "empty").ok());
}

TEST_CASE("open needs config.yaml and names the file that is missing") {
  temp_dir tmp;
  const auto dir = tmp.path() / "exp";
  std::filesystem::create_directories(dir);

  auto no_config = run_directory::open(dir);
  REQUIRE_FALSE(no_config.ok());
  CHECK(no_config.error().code == errc::not_found);
  CHECK(contains(no_config.error().message, (dir / "config.yaml").string()));
  CHECK_FALSE(std::filesystem::exists(dir / "run.lock"));  // a wrong dir is left untouched

  auto no_dir = run_directory::open(tmp.path() / "missing");
  REQUIRE_FALSE(no_dir.ok());
  CHECK(no_dir.error().code == errc::not_found);
  CHECK(contains(no_dir.error().message, (tmp.path() / "missing").string()));

  REQUIRE(write_file_atomic(dir / "config.yaml", "seed: 1\n").ok());
  auto run = run_directory::open(dir);
  REQUIRE(run.ok());
  CHECK(run->path() == dir);
  CHECK(run_directory_locked(dir));
}

TEST_CASE("a second holder in the same process gets busy with our pid") {
  temp_dir tmp;
  auto run = run_directory::create(tmp.path(), "exp");
  REQUIRE(run.ok());
  REQUIRE(write_file_atomic(run->config_file(), "seed: 1\n").ok());

  auto second = run_directory::open(run->path());
  REQUIRE_FALSE(second.ok());
  CHECK(second.error().code == errc::busy);
  CHECK(contains(second.error().message, run->path().string()));
  CHECK(contains(second.error().message, "pid " + std::to_string(::getpid())));
}

TEST_CASE("a moved run_directory keeps the lock until the last owner goes") {
  temp_dir tmp;
  auto created = run_directory::create(tmp.path(), "exp");
  REQUIRE(created.ok());
  const auto dir = created->path();
  {
    run_directory a = std::move(*created);
    run_directory b(std::move(a));
    CHECK(b.path() == dir);
    CHECK(run_directory_locked(dir));
  }
  CHECK_FALSE(run_directory_locked(dir));
}

TEST_CASE("run_directory_locked is false where no run ever started") {
  temp_dir tmp;
  CHECK_FALSE(run_directory_locked(tmp.path()));
  CHECK_FALSE(run_directory_locked(tmp.path() / "missing"));
}

TEST_CASE("a lock held by another process gives busy, and is free once that process is killed") {
  temp_dir tmp;
  const auto dir = tmp.path() / "exp";
  {
    auto run = run_directory::create(tmp.path(), "exp");
    REQUIRE(run.ok());
    REQUIRE(write_file_atomic(run->config_file(), "seed: 1\n").ok());
  }

  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    test::die_with_parent();
    ::close(ready[0]);
    auto run = run_directory::open(dir);
    char byte = run.ok() ? 'k' : 'e';
    if (::write(ready[1], &byte, 1) != 1) ::_exit(2);
    for (;;) ::pause();  // hold the lock until killed
  }
  test::child_guard child(pid);
  ::close(ready[1]);
  // Blocks until the child holds the lock (or reports failure); EOF if it died first.
  char byte = 0;
  ssize_t n;
  do {
    n = ::read(ready[0], &byte, 1);
  } while (n < 0 && errno == EINTR);
  ::close(ready[0]);
  if (n != 1 || byte != 'k') FAIL("child could not take the run lock");

  CHECK(run_directory_locked(dir));
  auto opened = run_directory::open(dir);
  REQUIRE_FALSE(opened.ok());
  CHECK(opened.error().code == errc::busy);
  CHECK(contains(opened.error().message, dir.string()));
  CHECK(contains(opened.error().message, "pid " + std::to_string(pid)));

  auto created = run_directory::create(tmp.path(), "exp", /*allow_existing=*/true);
  REQUIRE_FALSE(created.ok());
  CHECK(created.error().code == errc::busy);
  // Busy wins over "already holds a run": the live holder is the more useful thing to report.
  auto refused = run_directory::create(tmp.path(), "exp");
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code == errc::busy);

  int status = child.kill_and_wait();
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);

  CHECK_FALSE(run_directory_locked(dir));
  auto resumed = run_directory::open(dir);
  REQUIRE(resumed.ok());
  CHECK(trimmed_file(dir / "run.lock") == std::to_string(::getpid()));
}
