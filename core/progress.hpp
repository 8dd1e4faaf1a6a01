// core/progress.hpp: the text of a progress line ("checksumming 3.2/45.0 GB, 1.10 GB/s, 38s left")
// and a meter that draws it through logger::progress at most once a second.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "core/log.hpp"

namespace crucible {

/// "38s", "4m05s", "2h07m": a duration for a progress line.
std::string duration_text(double seconds);

/// What a progress_meter counts.
enum class progress_unit : std::uint8_t { items, bytes };

/// "WHAT DONE/TOTAL, RATE, LEFT left": items as "12/250, 0.50 s each", bytes in GB with GB/s
/// (in MB with MB/s below a GB in all).
/// `elapsed_s` is the time DONE took; no rate or time left before there is any.
std::string progress_text(std::string_view what, std::uint64_t done, std::uint64_t total, double elapsed_s,
                          progress_unit unit);

/// Long work's progress on `log`'s progress line (a terminal only, logger::progress; nothing
/// otherwise). update() may be called often and from several threads: it draws at most once a
/// second, and always the last update of a phase (done == total). A new `what` starts a new phase
/// (its own rate). finish() ends the line.
class progress_meter {
public:
  progress_meter(logger& log, std::string component, progress_unit unit);
  ~progress_meter() { finish(); }
  progress_meter(const progress_meter&) = delete;
  progress_meter& operator=(const progress_meter&) = delete;

  void update(std::string_view what, std::uint64_t done, std::uint64_t total);
  void finish();

private:
  using clock = std::chrono::steady_clock;
  logger& log_;
  std::string component_;
  progress_unit unit_;
  std::mutex mtx_;
  std::string what_;
  clock::time_point phase_start_{};
  clock::time_point last_draw_{};
  bool drawn_ = false;
};

} // namespace crucible
