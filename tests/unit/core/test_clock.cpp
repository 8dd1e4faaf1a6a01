#include <doctest/doctest.h>

#include "core/clock.hpp"

using namespace crucible;

TEST_CASE("manual_clock moves only when advanced, wall and monotonic together") {
  manual_clock clk;
  auto w0 = clk.now();
  auto m0 = clk.mono();
  CHECK(clk.now() == w0);
  clk.advance(std::chrono::seconds{5});
  CHECK(clk.now() - w0 == std::chrono::seconds{5});
  CHECK(clk.mono() - m0 == std::chrono::seconds{5});
}

TEST_CASE("ISO 8601 formatting is UTC with milliseconds, also before the epoch") {
  using namespace std::chrono;
  CHECK(format_iso8601(clock::wall_time{milliseconds{0}}) == "1970-01-01T00:00:00.000Z");
  CHECK(format_iso8601(clock::wall_time{milliseconds{1'700'000'000'123}}) == "2023-11-14T22:13:20.123Z");
  CHECK(format_iso8601(clock::wall_time{milliseconds{-1}}) == "1969-12-31T23:59:59.999Z");
}

TEST_CASE("system_clock is monotonic") {
  system_clock clk;
  auto a = clk.mono();
  auto b = clk.mono();
  CHECK(b >= a);
}
