#include "core/error.hpp"

#include <algorithm>

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
  // From the first of the checkout's top folders on ("../env/eval/boundary.cpp", as Ninja names
  // a source, or an absolute path): a site in a nested folder keeps its whole place.
  static constexpr std::string_view tops[] = {"actors/", "core/", "env/", "jinja/", "policy/", "service/",
                                              "storage/", "tests/", "text/", "tools/"};
  std::size_t best = std::string_view::npos;
  for (auto top : tops)
    for (std::size_t at = f.find(top); at != std::string_view::npos; at = f.find(top, at + 1))
      if (at == 0 || f[at - 1] == '/') {
        best = std::min(best, at);
        break;
      }
  if (best != std::string_view::npos) {
    f.remove_prefix(best);
  } else if (auto cut = f.rfind('/'); cut != std::string_view::npos && cut > 0) {
    // Elsewhere the file's folder and the file.
    if (auto dir = f.rfind('/', cut - 1); dir != std::string_view::npos)
      f.remove_prefix(dir + 1);
  }
  return std::string{f} + ":" + std::to_string(line);
}

} // namespace crucible
