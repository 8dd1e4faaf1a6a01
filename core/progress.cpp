#include "core/progress.hpp"

#include <cstdio>

namespace crucible {

std::string duration_text(double seconds) {
  const auto s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%llds", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, s % 3600 / 60);
  return buf;
}

std::string progress_text(std::string_view what, std::uint64_t done, std::uint64_t total, double elapsed_s,
                          progress_unit unit) {
  char buf[96];
  std::string out{what};
  // Bytes in GB, or in MB below a GB in all (a small model's checkpoint).
  const bool gb = total >= 1'000'000'000;
  const double scale = gb ? 1e9 : 1e6;
  const char* unit_name = gb ? "GB" : "MB";
  if (unit == progress_unit::bytes)
    std::snprintf(buf, sizeof buf, " %.1f/%.1f %s", static_cast<double>(done) / scale,
                  static_cast<double>(total) / scale, unit_name);
  else
    std::snprintf(buf, sizeof buf, " %llu/%llu", static_cast<unsigned long long>(done),
                  static_cast<unsigned long long>(total));
  out += buf;
  if (done == 0 || elapsed_s <= 0)
    return out;
  const double rate = static_cast<double>(done) / elapsed_s;
  if (unit == progress_unit::bytes)
    std::snprintf(buf, sizeof buf, ", %.2f %s/s", rate / scale, unit_name);
  else
    std::snprintf(buf, sizeof buf, ", %.2f s each", elapsed_s / static_cast<double>(done));
  out += buf;
  if (done < total)
    out += ", " + duration_text(static_cast<double>(total - done) / rate) + " left";
  return out;
}

progress_meter::progress_meter(logger& log, std::string component, progress_unit unit)
    : log_(log), component_(std::move(component)), unit_(unit) {}

void progress_meter::update(std::string_view what, std::uint64_t done, std::uint64_t total) {
  std::lock_guard guard{mtx_};
  const auto now = clock::now();
  if (what != what_) {
    what_ = what;
    phase_start_ = now;
  } else if (drawn_ && done < total && now - last_draw_ < std::chrono::seconds{1}) {
    return;
  }
  last_draw_ = now;
  drawn_ = true;
  log_.progress_line(component_,
                     progress_text(what, done, total, std::chrono::duration<double>(now - phase_start_).count(), unit_));
}

void progress_meter::finish() {
  std::lock_guard guard{mtx_};
  if (drawn_)
    log_.end_progress();
  drawn_ = false;
  what_.clear();
}

} // namespace crucible
