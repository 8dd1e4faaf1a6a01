#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <pty.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "core/log.hpp"
#include "core/progress.hpp"

using namespace crucible;

TEST_CASE("log levels parse and print") {
  CHECK(parse_log_level("warn") == log_level::warn);
  CHECK_FALSE(parse_log_level("WARN").has_value());
  CHECK(std::string{to_string(log_level::debug)} == "debug");
}

TEST_CASE("the file sink has its own threshold and timestamps come from the clock") {
  manual_clock clk{clock::wall_time{std::chrono::seconds{1'800'000'000}}};
  logger log{clk, log_level::off};
  auto path = std::filesystem::temp_directory_path() / ("crucible-log-" + std::to_string(::getpid()) + ".log");
  std::filesystem::remove(path);
  REQUIRE(log.open_file(path, log_level::info).ok());
  CHECK(log.enabled(log_level::info));
  CHECK_FALSE(log.enabled(log_level::debug));
  log.debug("test", "hidden");
  log.info("coord", "step ", 3, " done");
  clk.advance(std::chrono::milliseconds{1500});
  log.error("coord", "boom");
  std::ifstream in(path);
  std::string l1, l2, l3;
  std::getline(in, l1);
  std::getline(in, l2);
  CHECK_FALSE(std::getline(in, l3));
  CHECK(l1 == "2027-01-15T08:00:00.000Z INFO  [coord] step 3 done");
  CHECK(l2 == "2027-01-15T08:00:01.500Z ERROR [coord] boom");
  std::filesystem::remove(path);
}

TEST_CASE("opening a log file in a missing directory is an io error naming the path") {
  system_clock clk;
  logger log{clk, log_level::off};
  auto r = log.open_file("/nonexistent-dir/events.log", log_level::info);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::io);
  CHECK(r.error().message.find("/nonexistent-dir/events.log") != std::string::npos);
}

namespace {
// What a logger writes to stderr when stderr is a pseudo-terminal (TERM xterm) or a pipe: `body`
// runs in a child process whose stderr is that, with its own logger (at info, a file at info).
template <class Body>
std::string stderr_of(bool terminal, const std::filesystem::path& file, Body body) {
  int read_fd = -1, write_fd = -1;
  if (terminal) {
    REQUIRE(::openpty(&read_fd, &write_fd, nullptr, nullptr, nullptr) == 0);
    termios raw{};
    REQUIRE(::tcgetattr(write_fd, &raw) == 0);
    ::cfmakeraw(&raw); // no "\n" -> "\r\n": the bytes as written
    REQUIRE(::tcsetattr(write_fd, TCSANOW, &raw) == 0);
  } else {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    read_fd = p[0], write_fd = p[1];
  }
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(write_fd, 2);
    ::setenv("TERM", "xterm", 1);
    manual_clock clk{clock::wall_time{std::chrono::seconds{1'800'000'000}}};
    logger log{clk, log_level::info};
    if (!log.open_file(file, log_level::info).ok())
      ::_exit(3);
    body(log);
    std::fflush(stderr);
    ::_exit(0);
  }
  ::close(write_fd);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(read_fd, buf, sizeof buf)) > 0;) // a pty ends in EIO once the child is gone
    out.append(buf, static_cast<std::size_t>(n));
  ::close(read_fd);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return out;
}
} // namespace

TEST_CASE("progress is one line redrawn on a terminal, nothing on a pipe, and every step in the file") {
  auto file = std::filesystem::temp_directory_path() / ("crucible-progress-" + std::to_string(::getpid()) + ".log");
  auto steps = [](logger& log) {
    log.progress("train", "sft step 1/3, 0.50 s a step, 0m01s left");
    log.progress("train", "sft step 2/3, 0.50 s a step, 0m01s left");
    log.info("train", "checkpoint");
    log.end_progress();
    log.info("train", "stage rl");
  };
  std::filesystem::remove(file);
  const auto tty = stderr_of(true, file, steps);
  CHECK(tty == "\r\033[K[train] sft step 1/3, 0.50 s a step, 0m01s left"
               "\r\033[K[train] sft step 2/3, 0.50 s a step, 0m01s left"
               "\r\033[K2027-01-15T08:00:00.000Z INFO  [train] checkpoint\n"
               "\r\033[K[train] sft step 2/3, 0.50 s a step, 0m01s left" // drawn again under the line
               "\n2027-01-15T08:00:00.000Z INFO  [train] stage rl\n");
  std::filesystem::remove(file);
  const auto pipe = stderr_of(false, file, steps);
  CHECK(pipe == "2027-01-15T08:00:00.000Z INFO  [train] checkpoint\n"
                "2027-01-15T08:00:00.000Z INFO  [train] stage rl\n");
  std::ifstream in(file);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(all == "2027-01-15T08:00:00.000Z INFO  [train] sft step 1/3, 0.50 s a step, 0m01s left\n"
               "2027-01-15T08:00:00.000Z INFO  [train] sft step 2/3, 0.50 s a step, 0m01s left\n"
               "2027-01-15T08:00:00.000Z INFO  [train] checkpoint\n"
               "2027-01-15T08:00:00.000Z INFO  [train] stage rl\n");
  std::filesystem::remove(file);
}

TEST_CASE("progress texts give count, rate and time left, in items or GB") {
  CHECK(duration_text(0.4) == "0s");
  CHECK(duration_text(59.4) == "59s");
  CHECK(duration_text(61) == "1m01s");
  CHECK(duration_text(3599) == "59m59s");
  CHECK(duration_text(7322) == "2h02m");
  CHECK(progress_text("tasks", 0, 250, 0, progress_unit::items) == "tasks 0/250");
  CHECK(progress_text("tasks", 10, 250, 5, progress_unit::items) == "tasks 10/250, 0.50 s each, 2m00s left");
  CHECK(progress_text("checking", 3'200'000'000, 45'000'000'000, 2, progress_unit::bytes)
        == "checking 3.2/45.0 GB, 1.60 GB/s, 26s left");
  CHECK(progress_text("checking", 45'000'000'000, 45'000'000'000, 20, progress_unit::bytes)
        == "checking 45.0/45.0 GB, 2.25 GB/s"); // done: no time left
  CHECK(progress_text("writing the model", 4'000'000, 8'000'000, 0.5, progress_unit::bytes)
        == "writing the model 4.0/8.0 MB, 8.00 MB/s, 1s left"); // below a GB in all: MB
}

TEST_CASE("a progress meter draws on a terminal only, at most once a second and each phase's end, and never in the file") {
  auto file = std::filesystem::temp_directory_path() / ("crucible-meter-" + std::to_string(::getpid()) + ".log");
  auto work = [](logger& log) {
    progress_meter meter{log, "checkpoint", progress_unit::bytes};
    meter.update("checksumming", 0, 2'000'000'000);
    for (std::uint64_t i = 1; i < 100; ++i) // within a second of the first: not drawn
      meter.update("checksumming", i * 10'000'000, 2'000'000'000);
    meter.update("checksumming", 2'000'000'000, 2'000'000'000); // the phase's end: drawn
    meter.update("reading the weights", 0, 1'000'000'000);      // a new phase: drawn
    meter.finish();
    log.info("train", "restored");
  };
  std::filesystem::remove(file);
  const auto tty = stderr_of(true, file, work);
  CHECK(tty.find("[checkpoint] checksumming 0.0/2.0 GB") != std::string::npos);
  CHECK(tty.find("[checkpoint] checksumming 2.0/2.0 GB") != std::string::npos);
  CHECK(tty.find("[checkpoint] reading the weights 0.0/1.0 GB\n") != std::string::npos);
  CHECK(tty.find("0.5/2.0 GB") == std::string::npos);
  CHECK(tty.ends_with("INFO  [train] restored\n"));
  std::filesystem::remove(file);
  CHECK(stderr_of(false, file, work) == "2027-01-15T08:00:00.000Z INFO  [train] restored\n");
  std::ifstream in(file);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(all == "2027-01-15T08:00:00.000Z INFO  [train] restored\n");
  std::filesystem::remove(file);
}
