#include "core/token.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

namespace crucible {

result<std::string> read_token_file(const std::filesystem::path& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) {
    if (errno == ENOENT)
      return fail(errc::not_found, file.string(), ": no such token file");
    return fail(errc::io, file.string(), ": ", std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode))
    return fail(errc::invalid_arg, file.string(), ": not a regular file");
  // Like ssh with a private key: a secret that anyone on the machine may read is no secret, and
  // one that anyone may write lets them choose it.
  if ((st.st_mode & (S_IROTH | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return fail(errc::invalid_arg, file.string(), ": the token file may be read or written by others (mode ", mode,
                "); chmod 600 ", file.string());
  }
  std::ifstream in(file, std::ios::binary);
  if (!in)
    return fail(errc::io, file.string(), ": cannot read the token file");
  std::string line;
  std::getline(in, line);
  auto first = line.find_first_not_of(" \t\r\n");
  auto last = line.find_last_not_of(" \t\r\n");
  if (first == std::string::npos)
    return fail(errc::invalid_arg, file.string(), ": the token file's first line is empty");
  return line.substr(first, last - first + 1);
}

result<std::string> create_token_file(const std::filesystem::path& file) {
  std::random_device rd; // the system's random source (/dev/urandom or getrandom on Linux)
  static constexpr char digits[] = "0123456789abcdef";
  std::string token;
  for (int i = 0; i < 8; ++i) {
    auto word = static_cast<std::uint32_t>(rd());
    for (int j = 0; j < 8; ++j, word >>= 4)
      token += digits[word & 0xf];
  }
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST)
      return fail(errc::busy, file.string(), ": exists already");
    return fail(errc::io, file.string(), ": cannot create the token file: ", std::strerror(errno));
  }
  auto text = token + "\n";
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(file.c_str());
    return fail(errc::io, file.string(), ": cannot write the token file: ", std::strerror(err));
  }
  return token;
}

} // namespace crucible
