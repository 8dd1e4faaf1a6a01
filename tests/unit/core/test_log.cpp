#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "core/log.hpp"

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
