// tests/unit/storage/test_metrics_log.cpp: metrics.jsonl appends, torn-line repair, and a real
// SIGKILL of a child process in the middle of appending.
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sched.h>
#include <string>
#include <sys/resource.h>
#include <sys/stat.h>
#include <vector>

#include "storage/atomic_file.hpp"
#include "storage/metrics_log.hpp"
#include "storage_test_util.hpp"

using namespace crucible;
using namespace crucible::storage;
using crucible::storage::test::temp_dir;
using crucible::storage::test::wait_child;

namespace {

void write_raw(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string raw(const std::filesystem::path& path) {
  auto r = read_file(path);
  REQUIRE(r.ok());
  return *r;
}

// Fixed-length records so the parent can tell from the file size alone how many are written.
std::string record(int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%08d", i);
  return std::string("{\"i\":") + buf + ",\"pad\":\"" + std::string(80, 'x') + "\"}";
}

} // namespace

TEST_CASE("metrics_log appends records that read_metrics returns in order") {
  temp_dir tmp;
  const auto path = tmp.path() / "metrics.jsonl";
  {
    auto log = metrics_log::open(path);
    REQUIRE(log.ok());
    CHECK(log->repaired_bytes() == 0);
    REQUIRE(log->append(R"({"step":1,"reward":0.5})").ok());
    REQUIRE(log->append(R"({"step":2,"reward":0.75})").ok());
    REQUIRE(log->sync().ok());
  }
  {
    auto log = metrics_log::open(path);  // reopening a clean file changes nothing
    REQUIRE(log.ok());
    CHECK(log->repaired_bytes() == 0);
    REQUIRE(log->append(R"({"step":3,"reward":1.0})").ok());
  }
  auto lines = read_metrics(path);
  REQUIRE(lines.ok());
  REQUIRE(lines->size() == 3);
  CHECK((*lines)[0] == R"({"step":1,"reward":0.5})");
  CHECK((*lines)[1] == R"({"step":2,"reward":0.75})");
  CHECK((*lines)[2] == R"({"step":3,"reward":1.0})");
  CHECK(raw(path) == "{\"step\":1,\"reward\":0.5}\n{\"step\":2,\"reward\":0.75}\n"
                     "{\"step\":3,\"reward\":1.0}\n");
}

TEST_CASE("open repairs a torn last line and the next record starts on its own line") {
  temp_dir tmp;
  const auto path = tmp.path() / "metrics.jsonl";
  const std::string torn = R"({"step":3,"rew)";
  write_raw(path, "{\"step\":1}\n{\"step\":2}\n" + torn);

  // Before any repair, readers already skip the torn tail.
  auto before = read_metrics(path);
  REQUIRE(before.ok());
  REQUIRE(before->size() == 2);
  CHECK((*before)[1] == R"({"step":2})");

  auto log = metrics_log::open(path);
  REQUIRE(log.ok());
  CHECK(log->repaired_bytes() == torn.size());
  CHECK(raw(path) == "{\"step\":1}\n{\"step\":2}\n");

  REQUIRE(log->append(R"({"step":3})").ok());
  auto lines = read_metrics(path);
  REQUIRE(lines.ok());
  REQUIRE(lines->size() == 3);
  CHECK((*lines)[0] == R"({"step":1})");
  CHECK((*lines)[1] == R"({"step":2})");
  CHECK((*lines)[2] == R"({"step":3})");
  CHECK(raw(path) == "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n");
}

TEST_CASE("open cuts a file with no complete line down to nothing") {
  temp_dir tmp;
  const auto path = tmp.path() / "metrics.jsonl";
  write_raw(path, R"({"step":1,"loss")");
  CHECK(read_metrics(path)->empty());

  auto log = metrics_log::open(path);
  REQUIRE(log.ok());
  CHECK(log->repaired_bytes() == 16);
  REQUIRE(log->append(R"({"step":1})").ok());
  CHECK(raw(path) == "{\"step\":1}\n");
}

TEST_CASE("open finds the last newline of a torn tail longer than one read block") {
  temp_dir tmp;
  const auto path = tmp.path() / "metrics.jsonl";
  const std::string torn = "{\"blob\":\"" + std::string(20000, 'z');  // > the 8 KiB scan block
  write_raw(path, "{\"a\":1}\n" + torn);
  auto log = metrics_log::open(path);
  REQUIRE(log.ok());
  CHECK(log->repaired_bytes() == torn.size());
  CHECK(raw(path) == "{\"a\":1}\n");
}

TEST_CASE("read_metrics and open name the file they cannot use") {
  temp_dir tmp;
  const auto missing = tmp.path() / "metrics.jsonl";
  auto r = read_metrics(missing);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::not_found);
  CHECK(r.error().message.find(missing.string()) != std::string::npos);

  const auto no_dir = tmp.path() / "no-such-run" / "metrics.jsonl";
  auto log = metrics_log::open(no_dir);
  REQUIRE_FALSE(log.ok());
  CHECK(log.error().code == errc::io);
  CHECK(log.error().message.find(no_dir.string()) != std::string::npos);
}

TEST_CASE("a moved metrics_log keeps appending to the same file") {
  temp_dir tmp;
  const auto path = tmp.path() / "metrics.jsonl";
  auto opened = metrics_log::open(path);
  REQUIRE(opened.ok());
  metrics_log a = std::move(*opened);
  REQUIRE(a.append(R"({"n":1})").ok());
  metrics_log b(std::move(a));
  REQUIRE(b.append(R"({"n":2})").ok());

  auto other = metrics_log::open(tmp.path() / "other.jsonl");
  REQUIRE(other.ok());
  b = std::move(*other);  // closes the first file's descriptor, takes the second
  REQUIRE(b.append(R"({"n":3})").ok());

  CHECK(raw(path) == "{\"n\":1}\n{\"n\":2}\n");
  CHECK(raw(tmp.path() / "other.jsonl") == "{\"n\":3}\n");
}

TEST_CASE("a short write that then fails leaves no partial record behind") {
  temp_dir tmp;
  const auto path = tmp.path() / "metrics.jsonl";
  write_raw(path, "{\"step\":1}\n{\"step\":2}\n");
  const auto clean_size = std::filesystem::file_size(path);

  // RLIMIT_FSIZE makes the kernel write part of the record (a short write) and fail the rest
  // with EFBIG; a small record that fits must then still land on its own line.
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    auto log = metrics_log::open(path);
    if (!log.ok()) ::_exit(10);
    rlimit lim{clean_size + 20, clean_size + 20};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(11);
    auto big = log->append("{\"blob\":\"" + std::string(100, 'b') + "\"}");
    if (big.ok()) ::_exit(12);
    if (big.error().code != errc::io) ::_exit(13);
    if (big.error().message.find(path.string()) == std::string::npos) ::_exit(14);
    if (!log->append(R"({"step":3})").ok()) ::_exit(15);
    ::_exit(0);
  }
  int status = wait_child(pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(raw(path) == "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n");
}

#ifdef NDEBUG
TEST_CASE("release builds refuse a record with a newline instead of splitting it") {
  temp_dir tmp;
  const auto path = tmp.path() / "metrics.jsonl";
  auto log = metrics_log::open(path);
  REQUIRE(log.ok());
  auto r = log->append("{\"a\":1}\n{\"b\":2}");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::invalid_arg);
  CHECK(raw(path).empty());
}
#endif

TEST_CASE("a SIGKILLed appender leaves only complete records, and appends continue cleanly") {
  temp_dir tmp;
  const auto path = tmp.path() / "metrics.jsonl";
  const std::size_t line_len = record(0).size() + 1;
  constexpr int min_lines = 2000;
  constexpr int max_records = 200000;  // bounds the file (~20 MB) if the parent is slow

  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    test::die_with_parent();
    auto log = metrics_log::open(path);
    if (!log.ok()) ::_exit(10);
    for (int i = 0; i < max_records; ++i) {
      if (!log->append(record(i)).ok()) ::_exit(11);
    }
    for (;;) ::pause();  // wait for the kill; never exit on our own
  }

  test::child_guard child(pid);

  // Poll the size until the child has written enough; bounded by a deadline and by the child
  // dying early, never by a sleep.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool enough = false, child_died = false;
  int status = -1;
  while (std::chrono::steady_clock::now() < deadline) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 &&
        static_cast<std::size_t>(st.st_size) >= min_lines * line_len) {
      enough = true;
      break;
    }
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      child.reaped(status);
      child_died = true;
      break;
    }
    ::sched_yield();
  }
  if (!child_died) status = child.kill_and_wait();
  REQUIRE(enough);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);

  // Readers need no repair to see only whole records.
  auto before = read_metrics(path);
  REQUIRE(before.ok());
  REQUIRE(before->size() >= static_cast<std::size_t>(min_lines));
  for (std::size_t i = 0; i < before->size(); ++i) {
    if ((*before)[i] != record(static_cast<int>(i))) {
      FAIL("line ", i, " is not record ", i, ": ", (*before)[i]);
    }
  }

  const auto size_before = std::filesystem::file_size(path);
  auto log = metrics_log::open(path);
  REQUIRE(log.ok());
  CHECK(std::filesystem::file_size(path) == size_before - log->repaired_bytes());
  CHECK(std::filesystem::file_size(path) == before->size() * line_len);

  auto repaired = read_metrics(path);
  REQUIRE(repaired.ok());
  CHECK(*repaired == *before);

  REQUIRE(log->append(R"({"resumed":true})").ok());
  auto after = read_metrics(path);
  REQUIRE(after.ok());
  REQUIRE(after->size() == before->size() + 1);
  CHECK(after->back() == R"({"resumed":true})");
  CHECK((*after)[after->size() - 2] == record(static_cast<int>(before->size()) - 1));
  CHECK(raw(path).back() == '\n');
}

TEST_CASE("cut_metrics sets aside the records after an offset and keeps the file before it") {
  temp_dir tmp;
  const auto path = tmp.path() / "metrics.jsonl";
  const auto aside = tmp.path() / "metrics-after.jsonl";
  std::uint64_t keep = 0;
  {
    auto log = metrics_log::open(path);
    REQUIRE(log.ok());
    REQUIRE(log->append(R"({"step":1})").ok());
    keep = *log->size();
    REQUIRE(log->append(R"({"step":2})").ok());
    REQUIRE(log->append(R"({"event":"run_crashed"})").ok());
  }
  CHECK(cut_metrics(path, keep - 1, aside).error().code == errc::invalid_arg); // not a record's start
  CHECK(raw(path) == "{\"step\":1}\n{\"step\":2}\n{\"event\":\"run_crashed\"}\n");
  auto moved = cut_metrics(path, keep, aside);
  REQUIRE(moved.ok());
  CHECK(*moved == raw(aside).size());
  CHECK(raw(path) == "{\"step\":1}\n");
  CHECK(raw(aside) == "{\"step\":2}\n{\"event\":\"run_crashed\"}\n");
  // Nothing after the offset: nothing moves, nothing is written.
  std::filesystem::remove(aside);
  CHECK(*cut_metrics(path, keep, aside) == 0);
  CHECK_FALSE(std::filesystem::exists(aside));
  {
    auto log = metrics_log::open(path); // appends go on after the cut
    REQUIRE(log.ok());
    REQUIRE(log->append(R"({"step":2})").ok());
  }
  CHECK(raw(path) == "{\"step\":1}\n{\"step\":2}\n");
}
