#include "core/clock.hpp"

#include <cassert>
#include <cstdio>
#include <ctime>

namespace crucible {

manual_clock::manual_clock(wall_time start) : wall_(start) {}

clock::wall_time manual_clock::now() const {
  std::lock_guard guard{mtx_};
  return wall_;
}

clock::mono_time manual_clock::mono() const {
  std::lock_guard guard{mtx_};
  return mono_;
}

void manual_clock::advance(std::chrono::nanoseconds d) {
  assert(d.count() >= 0);
  std::lock_guard guard{mtx_};
  wall_ += std::chrono::duration_cast<std::chrono::system_clock::duration>(d);
  mono_ += d;
}

std::string format_iso8601(clock::wall_time t) {
  using namespace std::chrono;
  auto ms = duration_cast<milliseconds>(t.time_since_epoch()).count();
  auto secs = static_cast<std::time_t>(ms / 1000);
  auto rem = static_cast<int>(ms % 1000);
  if (rem < 0) {
    rem += 1000;
    --secs;
  }
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, rem);
  return buf;
}

} // namespace crucible
