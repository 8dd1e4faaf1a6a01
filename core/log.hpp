// core/log.hpp: levelled logging to stderr and to the run directory's events.log.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "core/clock.hpp"
#include "core/error.hpp"

namespace crucible {

enum class log_level : std::uint8_t { trace, debug, info, warn, error, off };

/// "info", "warn", ...
const char* to_string(log_level level) noexcept;
/// Parses "trace" .. "off"; nullopt for anything else.
std::optional<log_level> parse_log_level(std::string_view text) noexcept;

/// Writes timestamped lines to stderr and optionally a file, each with its own threshold.
/// Not a global: `main` creates one and passes it down. Thread-safe.
class logger final {
public:
  /// Logs through `clk` (which must outlive the logger) to stderr at `stderr_level` and above.
  logger(const clock& clk, log_level stderr_level);
  ~logger();
  logger(const logger&) = delete;
  logger& operator=(const logger&) = delete;

  /// Also append to `path` at `level` and above (one file; a second call replaces the first).
  result<void> open_file(const std::filesystem::path& path, log_level level);
  /// Stops writing to stderr below `level` (e.g. after a --quiet flag).
  void set_stderr_level(log_level level);

  /// True when a message at `level` would be written anywhere.
  bool enabled(log_level level) const noexcept;
  /// Writes one line: "2026-11-21T18:05:03.123Z INFO  [component] message".
  void write(log_level level, std::string_view component, std::string_view message);

  template <class... Ts>
  void log(log_level level, std::string_view component, const Ts&... parts) {
    if (!enabled(level))
      return;
    std::ostringstream os;
    (os << ... << parts);
    write(level, component, os.str());
  }
  /// Progress of long work (a stage's steps): on a terminal (stderr a tty, TERM not "dumb"), at
  /// info and above, one line redrawn in place, which other lines print over and draw again
  /// after; nothing on stderr otherwise (logs stay free of it). events.log gets it as an info
  /// line either way.
  void progress(std::string_view component, std::string_view message);
  /// The terminal's part of progress() only: nothing in events.log (a meter redrawn every second,
  /// core/progress.hpp).
  void progress_line(std::string_view component, std::string_view message);
  /// Ends the progress line on the terminal (the next one starts on a line of its own).
  void end_progress();
  template <class... Ts> void debug(std::string_view c, const Ts&... xs) { log(log_level::debug, c, xs...); }
  template <class... Ts> void info(std::string_view c, const Ts&... xs) { log(log_level::info, c, xs...); }
  template <class... Ts> void warn(std::string_view c, const Ts&... xs) { log(log_level::warn, c, xs...); }
  template <class... Ts> void error(std::string_view c, const Ts&... xs) { log(log_level::error, c, xs...); }

private:
  void write(log_level level, std::string_view component, std::string_view message, bool to_stderr);

  const clock& clock_;
  mutable std::mutex mtx_;
  log_level stderr_level_;
  log_level file_level_ = log_level::off;
  std::FILE* file_ = nullptr;
  bool terminal_ = false;      // stderr is a terminal that can redraw a line
  std::string progress_;       // the progress line shown now on the terminal ("" : none)
};

} // namespace crucible
