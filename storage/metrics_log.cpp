// storage/metrics_log.cpp: metrics.jsonl appends (coordinator) and reads (status, report, watch).
#include "storage/metrics_log.hpp"

#include <cassert>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/atomic_file.hpp"

namespace crucible::storage {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Offset just past the last '\n' in the first `size` bytes of `fd`, or 0 if there is none.
// Scans backwards in blocks so a large clean log costs one small read, not a full scan.
result<std::uint64_t> end_of_last_line(int fd, std::uint64_t size,
                                       const std::filesystem::path& path) {
  char buf[8192];
  std::uint64_t end = size;
  while (end > 0) {
    std::uint64_t len = end < sizeof buf ? end : sizeof buf;
    std::uint64_t start = end - len;
    ssize_t n = ::pread(fd, buf, len, static_cast<off_t>(start));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      return fail(errc::io, "cannot read ", path.string(), ": ", errno_text(err));
    }
    if (static_cast<std::uint64_t>(n) != len)
      return fail(errc::io, "cannot read ", path.string(), ": file shrank while being repaired");
    for (std::uint64_t i = len; i > 0; --i) {
      if (buf[i - 1] == '\n') return start + i;
    }
    end = start;
  }
  return std::uint64_t{0};
}

} // namespace

result<metrics_log> metrics_log::open(const std::filesystem::path& path) {
  // O_RDWR rather than O_WRONLY: repair has to read the tail to find the last newline.
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    int err = errno;
    return fail(errc::io, "cannot open ", path.string(), ": ", errno_text(err));
  }
  metrics_log log(fd, 0);  // owns fd from here, so every early return closes it
  log.path_ = path;

  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    return fail(errc::io, "cannot stat ", path.string(), ": ", errno_text(err));
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size == 0) return log;

  auto keep = end_of_last_line(fd, size, path);
  if (!keep) return keep.error();
  if (*keep < size) {
    // A crash mid-append left a partial record. Cutting it (rather than terminating it with a
    // '\n') keeps every line in the file a record that was written whole.
    if (::ftruncate(fd, static_cast<off_t>(*keep)) != 0) {
      int err = errno;
      return fail(errc::io, "cannot truncate torn last line of ", path.string(), ": ",
                  errno_text(err));
    }
    // Make the cut durable before new records land after it, or a second crash could bring the
    // torn bytes back in front of them.
    if (::fsync(fd) != 0) {
      int err = errno;
      return fail(errc::io, "cannot fsync ", path.string(), ": ", errno_text(err));
    }
    log.repaired_bytes_ = size - *keep;
  }
  return log;
}

metrics_log::metrics_log(metrics_log&& other) noexcept
    : fd_(other.fd_), repaired_bytes_(other.repaired_bytes_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

metrics_log& metrics_log::operator=(metrics_log&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    repaired_bytes_ = other.repaired_bytes_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

metrics_log::~metrics_log() {
  if (fd_ >= 0) ::close(fd_);
}

result<void> metrics_log::append(std::string_view json_object) {
  assert(fd_ >= 0 && "append on a moved-from metrics_log");
  const bool has_newline = json_object.find('\n') != std::string_view::npos;
  assert(!has_newline && "metrics record must be a single line");
  // Release builds drop the assert; refuse the record anyway, since writing it would split one
  // record into lines that readers cannot parse.
  if (has_newline)
    return fail(errc::invalid_arg, path_.string(), ": metrics record contains a newline");

  std::string line;
  line.reserve(json_object.size() + 1);
  line.append(json_object);
  line.push_back('\n');

  // One write(2) on O_APPEND puts the whole line at the end in one step; the loop only runs
  // again when the kernel wrote part of it (signal, file-size limit, full disk).
  const char* p = line.data();
  std::size_t left = line.size();
  std::size_t written = 0;
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      if (written > 0) {
        // A part of this record is already in the file. Cut it off, or the next record would
        // be glued to it. With O_APPEND the offset sits just after our bytes.
        off_t end = ::lseek(fd_, 0, SEEK_CUR);
        if (end >= static_cast<off_t>(written))
          (void)::ftruncate(fd_, end - static_cast<off_t>(written));
      }
      return fail(errc::io, "cannot append to ", path_.string(), ": ", errno_text(err));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
    written += static_cast<std::size_t>(n);
  }
  return {};
}

result<void> metrics_log::sync() {
  assert(fd_ >= 0 && "sync on a moved-from metrics_log");
  if (::fsync(fd_) != 0) {
    int err = errno;
    return fail(errc::io, "cannot fsync ", path_.string(), ": ", errno_text(err));
  }
  return {};
}

result<std::uint64_t> metrics_log::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    int err = errno;
    return fail(errc::io, "cannot stat ", path_.string(), ": ", errno_text(err));
  }
  return static_cast<std::uint64_t>(st.st_size);
}

result<std::uint64_t> cut_metrics(const std::filesystem::path& path, std::uint64_t keep,
                                  const std::filesystem::path& aside) {
  auto text = read_file(path);
  if (!text) return text.error();
  if (text->size() <= keep) return std::uint64_t{0};
  if (keep > 0 && (*text)[keep - 1] != '\n')
    return fail(errc::invalid_arg, path.string(), ": byte ", std::to_string(keep), " does not start a record");
  if (auto w = write_file_atomic(aside, std::string_view(*text).substr(keep)); !w) return w.error();
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    int err = errno;
    return fail(errc::io, "cannot open ", path.string(), ": ", errno_text(err));
  }
  const bool ok = ::ftruncate(fd, static_cast<off_t>(keep)) == 0 && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return fail(errc::io, "cannot cut ", path.string(), " back to ", std::to_string(keep), " bytes: ", errno_text(err));
  return static_cast<std::uint64_t>(text->size() - keep);
}

result<std::vector<std::string>> read_metrics(const std::filesystem::path& path) {
  auto content = read_file(path);
  if (!content) return content.error();
  const std::string& text = *content;

  std::vector<std::string> lines;
  std::size_t begin = 0;
  // Only text followed by '\n' is a complete record; whatever follows the last '\n' is a torn
  // tail (or an append in flight) and is left out.
  for (std::size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', begin)) {
    lines.emplace_back(text, begin, nl - begin);
    begin = nl + 1;
  }
  return lines;
}

} // namespace crucible::storage
