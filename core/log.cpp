#include "core/log.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>

namespace crucible {

const char* to_string(log_level level) noexcept {
  switch (level) {
    case log_level::trace: return "trace";
    case log_level::debug: return "debug";
    case log_level::info: return "info";
    case log_level::warn: return "warn";
    case log_level::error: return "error";
    case log_level::off: return "off";
  }
  return "?";
}

std::optional<log_level> parse_log_level(std::string_view text) noexcept {
  for (auto lvl : {log_level::trace, log_level::debug, log_level::info, log_level::warn,
                   log_level::error, log_level::off})
    if (text == to_string(lvl))
      return lvl;
  return std::nullopt;
}

logger::logger(const clock& clk, log_level stderr_level)
  : clock_(clk), stderr_level_(stderr_level) {
  const char* term = std::getenv("TERM");
  terminal_ = ::isatty(STDERR_FILENO) == 1 && term != nullptr && std::string_view{term} != "dumb";
}

logger::~logger() {
  if (file_ != nullptr)
    std::fclose(file_);
}

result<void> logger::open_file(const std::filesystem::path& path, log_level level) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr)
    return fail(errc::io, "cannot open log file ", path.string(), ": ", std::strerror(errno));
  std::lock_guard guard{mtx_};
  if (file_ != nullptr)
    std::fclose(file_);
  file_ = f;
  file_level_ = level;
  return {};
}

void logger::set_stderr_level(log_level level) {
  std::lock_guard guard{mtx_};
  stderr_level_ = level;
}

bool logger::enabled(log_level level) const noexcept {
  std::lock_guard guard{mtx_};
  return level != log_level::off
         && (level >= stderr_level_ || (file_ != nullptr && level >= file_level_));
}

namespace {
constexpr std::string_view clear_line = "\r\033[K";
} // namespace

void logger::progress(std::string_view component, std::string_view message) {
  progress_line(component, message);
  {
    std::lock_guard guard{mtx_};
    if (file_ == nullptr || log_level::info < file_level_)
      return;
  }
  write(log_level::info, component, message, /*to_stderr=*/false);
}

void logger::progress_line(std::string_view component, std::string_view message) {
  std::lock_guard guard{mtx_};
  if (!terminal_ || log_level::info < stderr_level_)
    return;
  progress_ = std::string{clear_line} + "[" + std::string{component} + "] " + std::string{message};
  std::fwrite(progress_.data(), 1, progress_.size(), stderr);
  std::fflush(stderr);
}

void logger::end_progress() {
  std::lock_guard guard{mtx_};
  if (!progress_.empty())
    std::fputc('\n', stderr);
  progress_.clear();
}

void logger::write(log_level level, std::string_view component, std::string_view message) {
  write(level, component, message, true);
}

void logger::write(log_level level, std::string_view component, std::string_view message, bool to_stderr) {
  std::string line = format_iso8601(clock_.now());
  char tag[8];
  std::snprintf(tag, sizeof tag, " %-5s", to_string(level));
  for (char* p = tag; *p != '\0'; ++p)
    if (*p >= 'a' && *p <= 'z')
      *p = static_cast<char>(*p - 'a' + 'A');
  line += tag;
  line += " [";
  line += component;
  line += "] ";
  line += message;
  line += '\n';
  std::lock_guard guard{mtx_};
  if (to_stderr && level >= stderr_level_) {
    // Over the progress line, which is drawn again below.
    if (!progress_.empty())
      std::fwrite(clear_line.data(), 1, clear_line.size(), stderr);
    std::fwrite(line.data(), 1, line.size(), stderr);
    if (!progress_.empty()) {
      std::fwrite(progress_.data(), 1, progress_.size(), stderr);
      std::fflush(stderr);
    }
  }
  if (file_ != nullptr && level >= file_level_) {
    std::fwrite(line.data(), 1, line.size(), file_);
    std::fflush(file_);
  }
}

} // namespace crucible
