#include "core/error.hpp"

namespace crucible {

const char* to_string(errc code) noexcept {
  switch (code) {
    case errc::none: return "none";
    case errc::config: return "config";
    case errc::io: return "io";
    case errc::corrupt: return "corrupt";
    case errc::busy: return "busy";
    case errc::not_found: return "not_found";
    case errc::invalid_arg: return "invalid_arg";
    case errc::protocol: return "protocol";
    case errc::refused: return "refused";
    case errc::timeout: return "timeout";
    case errc::device: return "device";
    case errc::worker_lost: return "worker_lost";
    case errc::unsupported: return "unsupported";
    case errc::cancelled: return "cancelled";
  }
  return "unknown";
}

std::string error::to_string() const {
  std::string out = crucible::to_string(code);
  if (!message.empty()) {
    out += ": ";
    out += message;
  }
  return out;
}

std::string source_site(const char* file, int line) {
  std::string_view f{file != nullptr ? file : "?"};
  auto cut = f.rfind('/');
  if (cut != std::string_view::npos && cut > 0)
    if (auto dir = f.rfind('/', cut - 1); dir != std::string_view::npos)
      f.remove_prefix(dir + 1);
  return std::string{f} + ":" + std::to_string(line);
}

} // namespace crucible
