#include "core/log.hpp"

#include <cerrno>
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
  : clock_(clk), stderr_level_(stderr_level) {}

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

void logger::write(log_level level, std::string_view component, std::string_view message) {
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
  if (level >= stderr_level_)
    std::fwrite(line.data(), 1, line.size(), stderr);
  if (file_ != nullptr && level >= file_level_) {
    std::fwrite(line.data(), 1, line.size(), file_);
    std::fflush(file_);
  }
}

} // namespace crucible
