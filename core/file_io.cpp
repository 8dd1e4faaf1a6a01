// core/file_io.cpp: whole-file reads, and replacement by temp file + fsync + rename + directory fsync.
#include "core/file_io.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/utf8.hpp"

namespace crucible {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Retries EINTR so a signal arriving mid-call is not reported as an I/O failure.
int open_retry(const char* path, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::open(path, flags, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// write(2) may write less than asked (signals, quotas); loop until all of it is out.
bool write_all(int fd, std::string_view data, int& err) {
  const char* p = data.data();
  std::size_t left = data.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      return false;
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return true;
}

// The temp name must be unique across processes (pid) and across threads of one process
// (counter), so two writers of distinct targets in one directory never share a temp file.
std::filesystem::path temp_path_for(const std::filesystem::path& path) {
  static std::atomic<unsigned long> counter{0};
  std::string name = ".";
  // Clipped so that the suffix below never pushes a long (but legal) name past NAME_MAX.
  name += path.filename().string().substr(0, 200);
  name += ".tmp.";
  name += std::to_string(::getpid());
  name += '.';
  name += std::to_string(counter.fetch_add(1, std::memory_order_relaxed));
  return path.parent_path() / name;
}

} // namespace

result<void> write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  if (path.filename().empty())
    return fail(errc::invalid_arg, path.string(), ": not a file path");
  const std::filesystem::path tmp = temp_path_for(path);
  // O_EXCL: never write into a file someone else created under our temp name.
  int fd = open_retry(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    return fail(errc::io, "cannot create temporary file for ", path.string(), ": ",
                errno_text(err));
  }

  // From here on every failure must remove the temp file so no debris accumulates.
  auto abandon = [&](const char* what, int err) -> result<void> {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return fail(errc::io, "cannot ", what, " ", path.string(), ": ", errno_text(err));
  };

  int err = 0;
  if (!write_all(fd, content, err)) return abandon("write", err);
  // fsync before rename: otherwise a crash could leave the new name pointing at empty data.
  if (::fsync(fd) != 0) return abandon("fsync", errno);
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0 && errno != EINTR) return abandon("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return abandon("rename over", errno);

  // The rename is only durable once the directory entry itself is on disk.
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  return fsync_directory(dir);
}

result<std::string> read_file(const std::filesystem::path& path) {
  int fd = open_retry(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return fail(errc::not_found, path.string(), ": no such file");
    return fail(errc::io, "cannot open ", path.string(), ": ", errno_text(err));
  }
  std::string out;
  char buf[64 * 1024];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return fail(errc::io, "cannot read ", path.string(), ": ", errno_text(err));
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

result<std::string> read_source_file(const std::filesystem::path& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::is_directory(st))
    return fail(errc::invalid_arg, path.string(), ": is a directory, not a source file");
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
    return fail(errc::invalid_arg, path.string(), ": is not a regular file");
  auto text = read_file(path);
  if (!text)
    return text;
  const std::string_view s = *text;
  for (std::size_t i = 0; i < s.size();) {
    if (s[i] == '\0')
      return fail(errc::invalid_arg, path.string(), ": is not a text file (a NUL byte at offset ", std::to_string(i), ")");
    const auto u = decode_utf8(s, i);
    if (u.len == 0)
      return fail(errc::invalid_arg, path.string(), ": is not a text file (bytes that are not UTF-8 at offset ",
                  std::to_string(i), ")");
    i += u.len;
  }
  return text;
}

result<void> fsync_directory(const std::filesystem::path& dir) {
  int fd = open_retry(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return fail(errc::io, "cannot open directory ", dir.string(), ": ", errno_text(err));
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    // EINVAL: this file system cannot sync directories at all; there is no stronger guarantee
    // to ask for, so failing every write on it would only make the feature unusable.
    if (err == EINVAL) return {};
    return fail(errc::io, "cannot fsync directory ", dir.string(), ": ", errno_text(err));
  }
  ::close(fd);
  return {};
}

std::filesystem::path executable_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path{} : p.parent_path();
}

std::string shipped_path(const std::string& configured) {
  namespace fs = std::filesystem;
  const fs::path rel{configured};
  std::error_code ec;
  if (configured.empty() || rel.is_absolute() || fs::exists(rel, ec))
    return configured;
  for (auto dir = executable_dir(); !dir.empty(); dir = dir.parent_path()) {
    if (fs::exists(dir / rel, ec))
      return (dir / rel).string();
    if (dir == dir.root_path())
      break;
  }
  return configured;
}

std::uint64_t directory_bytes(const std::filesystem::path& dir) {
  std::uint64_t bytes = 0;
  std::error_code ec;
  for (std::filesystem::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (std::error_code e2; it->is_regular_file(e2))
      bytes += it->file_size(e2);
  return bytes;
}

} // namespace crucible
