// core/clock.hpp: time as an injected dependency, so tests can drive it.
#pragma once

#include <chrono>
#include <mutex>
#include <string>

namespace crucible {

/// Source of wall-clock and monotonic time. Implementations are thread-safe.
class clock {
public:
  using wall_time = std::chrono::system_clock::time_point;
  using mono_time = std::chrono::steady_clock::time_point;

  virtual ~clock() = default;
  /// Calendar time, for logs and records.
  virtual wall_time now() const = 0;
  /// Monotonic time, for deadlines and durations.
  virtual mono_time mono() const = 0;
};

/// The operating system's clocks.
class system_clock final : public clock {
public:
  wall_time now() const override { return std::chrono::system_clock::now(); }
  mono_time mono() const override { return std::chrono::steady_clock::now(); }
};

/// A clock that moves only when told to. Thread-safe.
class manual_clock final : public clock {
public:
  /// Starts at `start` (wall) and at the steady clock's epoch (monotonic).
  explicit manual_clock(wall_time start = wall_time{std::chrono::seconds{1'700'000'000}});

  wall_time now() const override;
  mono_time mono() const override;
  /// Moves both clocks forward by `d` (must be non-negative).
  void advance(std::chrono::nanoseconds d);

private:
  mutable std::mutex mtx_;
  wall_time wall_;
  mono_time mono_{};
};

/// "2026-11-21T18:05:03.123Z" (UTC, millisecond precision).
std::string format_iso8601(clock::wall_time t);

} // namespace crucible
