// tests/unit/storage/test_atomic_file.cpp: write_file_atomic, read_file and fsync_directory on a
// private temp dir, including failures injected with a real file-size limit in a child process.
#include <doctest/doctest.h>

#include <atomic>
#include <csignal>
#include <fstream>
#include <string>
#include <sys/resource.h>
#include <thread>
#include <vector>

#include "storage/atomic_file.hpp"
#include "storage_test_util.hpp"

using namespace crucible;
using namespace crucible::storage;
using crucible::storage::test::entry_count;
using crucible::storage::test::temp_dir;
using crucible::storage::test::wait_child;

TEST_CASE("write_file_atomic creates, replaces and leaves no temporary files") {
  temp_dir tmp;
  const auto target = tmp.path() / "status.json";

  REQUIRE(write_file_atomic(target, "{\"step\":1}").ok());
  auto first = read_file(target);
  REQUIRE(first.ok());
  CHECK(*first == "{\"step\":1}");

  REQUIRE(write_file_atomic(target, "{\"step\":2,\"longer\":true}").ok());
  CHECK(*read_file(target) == "{\"step\":2,\"longer\":true}");

  REQUIRE(write_file_atomic(target, "").ok());
  CHECK(read_file(target)->empty());

  std::string binary("a\0b\nc", 5);
  REQUIRE(write_file_atomic(target, binary).ok());
  CHECK(*read_file(target) == binary);

  CHECK(entry_count(tmp.path()) == 1);  // only the target: every temp file was renamed away
}

TEST_CASE("read_file reports a missing file as not_found, naming it") {
  temp_dir tmp;
  const auto missing = tmp.path() / "nope.yaml";
  auto r = read_file(missing);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::not_found);
  CHECK(r.error().message.find(missing.string()) != std::string::npos);

  auto dir = read_file(tmp.path());  // a directory cannot be read as a file
  REQUIRE_FALSE(dir.ok());
  CHECK(dir.error().code == errc::io);
}

TEST_CASE("read_source_file refuses a directory, a device and bytes that are not UTF-8 text, naming them") {
  temp_dir tmp;
  const auto good = tmp.path() / "c.py";
  const std::string text = "# \xc3\xa9t\xc3\xa9 \xe2\x88\x91 \xf0\x9f\x94\xa5\nclass ModelNew: pass\n";
  REQUIRE(write_file_atomic(good, text).ok());
  auto ok = read_source_file(good);
  REQUIRE(ok.ok());
  CHECK(*ok == text);

  auto missing = read_source_file(tmp.path() / "nope.py");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().code == errc::not_found);

  auto dir = read_source_file(tmp.path());
  REQUIRE_FALSE(dir.ok());
  CHECK(dir.error().code == errc::invalid_arg);
  CHECK(dir.error().message.find("is a directory") != std::string::npos);

  auto dev = read_source_file("/dev/null");
  REQUIRE_FALSE(dev.ok());
  CHECK(dev.error().message.find("not a regular file") != std::string::npos);

  auto refused = [&](const std::string& bytes, const std::string& what) {
    const auto f = tmp.path() / "bad.py";
    REQUIRE(write_file_atomic(f, bytes).ok());
    auto r = read_source_file(f);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == errc::invalid_arg);
    CHECK_MESSAGE(r.error().message.find(what) != std::string::npos, r.error().message);
    CHECK(r.error().message.find(f.string()) != std::string::npos);
  };
  refused(std::string("import torch\n\0\x01", 15), "a NUL byte at offset 13");
  refused("x = 1\n\x7f" "ELF\xff\xfe", "not UTF-8 at offset 10");
  refused("\xc0\xaf", "not UTF-8 at offset 0");          // an overlong '/'
  refused("ok\xed\xa0\x80", "not UTF-8 at offset 2");  // a surrogate
  refused("ok\xe2\x88", "not UTF-8 at offset 2");       // cut short at the end
}

TEST_CASE("write_file_atomic fails with io when the parent directory does not exist") {
  temp_dir tmp;
  const auto target = tmp.path() / "no-such-dir" / "config.yaml";
  auto r = write_file_atomic(target, "x");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::io);
  CHECK(r.error().message.find(target.string()) != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(tmp.path() / "no-such-dir"));
  CHECK(entry_count(tmp.path()) == 0);
}

TEST_CASE("a write that fails midway keeps the old content and removes the temporary file") {
  temp_dir tmp;
  const auto target = tmp.path() / "manifest.json";
  const std::string old_content = "{\"old\":true}";
  REQUIRE(write_file_atomic(target, old_content).ok());

  // Root ignores permissions, so the failure comes from RLIMIT_FSIZE: the kernel writes up to
  // the limit (a short write), then fails the rest with EFBIG. Done in a child so the limit
  // does not leak into the other tests.
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{4096, 4096};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(10);
    auto r = write_file_atomic(target, std::string(64 * 1024, 'n'));
    if (r.ok()) ::_exit(11);
    if (r.error().code != errc::io) ::_exit(12);
    if (r.error().message.find(target.string()) == std::string::npos) ::_exit(13);
    ::_exit(0);
  }
  int status = wait_child(pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  CHECK(*read_file(target) == old_content);
  CHECK(entry_count(tmp.path()) == 1);  // the partial temp file was removed
}

TEST_CASE("a failed rename keeps the target and removes the temporary file") {
  temp_dir tmp;
  // A non-empty directory cannot be replaced by a file: rename(2) fails with EISDIR.
  const auto target = tmp.path() / "checkpoints";
  std::filesystem::create_directory(target);
  std::ofstream(target / "keep") << "kept";

  auto r = write_file_atomic(target, "x");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::io);
  CHECK(r.error().message.find(target.string()) != std::string::npos);
  CHECK(std::filesystem::is_directory(target));
  CHECK(*read_file(target / "keep") == "kept");
  CHECK(entry_count(tmp.path()) == 1);
}

TEST_CASE("concurrent readers see the old or the new content, never a mix") {
  temp_dir tmp;
  const auto target = tmp.path() / "status.json";
  const std::string a(200 * 1024, 'a');
  const std::string b(300 * 1024, 'b');
  REQUIRE(write_file_atomic(target, a).ok());

  constexpr int writes = 100;
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    test::die_with_parent();
    for (int i = 0; i < writes; ++i) {
      if (!write_file_atomic(target, (i % 2) ? a : b).ok()) ::_exit(1);
    }
    ::_exit(0);
  }

  // Read until the writer has finished; the loop is bounded by the child's finite work.
  int reads = 0, mixed = 0, status = -1;
  for (;;) {
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    auto r = read_file(target);
    ++reads;
    if (!r.ok() || !(*r == a || *r == b)) ++mixed;
    if (done == pid) break;
    if (done < 0 && errno != EINTR) break;
  }
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(reads > 0);
  CHECK(mixed == 0);
  CHECK(*read_file(target) == a);  // the last write (i = writes - 1, odd) wrote `a`
  CHECK(entry_count(tmp.path()) == 1);
}

TEST_CASE("threads writing distinct files in one directory do not collide") {
  temp_dir tmp;
  constexpr int threads = 4, rounds = 20;
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const auto path = tmp.path() / ("file-" + std::to_string(t));
      for (int i = 0; i < rounds; ++i) {
        std::string content = std::to_string(t) + ":" + std::to_string(i);
        if (!write_file_atomic(path, content).ok()) ++failures;
      }
    });
  }
  for (auto& th : pool) th.join();
  CHECK(failures.load() == 0);
  for (int t = 0; t < threads; ++t) {
    auto r = read_file(tmp.path() / ("file-" + std::to_string(t)));
    REQUIRE(r.ok());
    CHECK(*r == std::to_string(t) + ":" + std::to_string(rounds - 1));
  }
  CHECK(entry_count(tmp.path()) == threads);
}

TEST_CASE("threads replacing the same file each use their own temporary file") {
  // Beyond the header's promise (distinct paths), but what the pid + counter temp name is for:
  // two writers of one status file must not trip over each other's temp file.
  temp_dir tmp;
  const auto path = tmp.path() / "status.json";
  constexpr int threads = 4, rounds = 50;
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        if (!write_file_atomic(path, "writer " + std::to_string(t)).ok()) ++failures;
      }
    });
  }
  for (auto& th : pool) th.join();
  CHECK(failures.load() == 0);
  auto r = read_file(path);
  REQUIRE(r.ok());
  CHECK(r->rfind("writer ", 0) == 0);
  CHECK(entry_count(tmp.path()) == 1);
}

TEST_CASE("fsync_directory syncs a directory and names the path it cannot open") {
  temp_dir tmp;
  CHECK(fsync_directory(tmp.path()).ok());

  const auto missing = tmp.path() / "gone";
  auto r = fsync_directory(missing);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::io);
  CHECK(r.error().message.find(missing.string()) != std::string::npos);

  const auto file = tmp.path() / "file";
  REQUIRE(write_file_atomic(file, "x").ok());
  auto not_dir = fsync_directory(file);
  REQUIRE_FALSE(not_dir.ok());
  CHECK(not_dir.error().code == errc::io);
}
