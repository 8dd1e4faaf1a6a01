// storage/run_dir.cpp: creates and opens runs/NAME/ and holds its run.lock for the process.
#include "storage/run_dir.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/file.h>
#include <system_error>
#include <unistd.h>

#include "storage/atomic_file.hpp"

namespace crucible::storage {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

int flock_retry(int fd, int op) {
  int rc;
  do {
    rc = ::flock(fd, op);
  } while (rc != 0 && errno == EINTR);
  return rc;
}

// The pid the current holder wrote into run.lock, or "unknown" if it has not written it yet
// (it takes the lock before writing) or wrote something unreadable.
std::string holder_pid(int fd) {
  char buf[32];
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "unknown";
  std::string text(buf, static_cast<std::size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return "unknown";
  return text;
}

// Opens (creating if needed) `dir/run.lock` and takes an exclusive non-blocking flock on it.
// flock rather than fcntl locks: it belongs to the open file description, so it is not dropped
// when some other part of the process closes an unrelated descriptor of the same file, and the
// kernel releases it when the process dies, kill -9 included.
result<int> take_lock(const std::filesystem::path& dir) {
  const std::filesystem::path lock_path = dir / "run.lock";
  int fd;
  do {
    fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    int err = errno;
    return fail(errc::io, "cannot open ", lock_path.string(), ": ", errno_text(err));
  }
  if (flock_retry(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    if (err == EWOULDBLOCK) {
      std::string pid = holder_pid(fd);
      ::close(fd);
      return fail(errc::busy, "run directory ", dir.string(), " is held by pid ", pid);
    }
    ::close(fd);
    return fail(errc::io, "cannot lock ", lock_path.string(), ": ", errno_text(err));
  }
  // The pid is informational (error messages, operators); the lock itself is the flock.
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    int err = errno;
    ::close(fd);
    return fail(errc::io, "cannot write pid to ", lock_path.string(), ": ", errno_text(err));
  }
  return fd;
}

result<void> validate_name(const std::string& name) {
  if (name.empty()) return fail(errc::invalid_arg, "run name is empty");
  if (name == "." || name == "..")
    return fail(errc::invalid_arg, "run name '", name, "' is not a directory name");
  if (name.find('/') != std::string::npos || name.find('\0') != std::string::npos)
    return fail(errc::invalid_arg, "run name '", name, "' must not contain '/' or NUL");
  return {};
}

} // namespace

result<run_directory> run_directory::create(const std::filesystem::path& root,
                                            const std::string& name, bool allow_existing) {
  if (auto ok = validate_name(name); !ok) return ok.error();
  std::filesystem::path dir = root / name;

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return fail(errc::io, "cannot create run directory ", dir.string(), ": ", ec.message());

  // Lock before looking at config.yaml, so a live run reports busy rather than "exists", and no
  // other process can start the run between our check and our use of it.
  auto lock = take_lock(dir);
  if (!lock) return lock.error();
  run_directory run(dir, *lock);  // owns the lock from here; early returns release it

  const std::filesystem::path config = run.config_file();
  if (!allow_existing && std::filesystem::exists(config, ec))
    return fail(errc::invalid_arg, "run directory ", dir.string(), " already holds a run (",
                config.string(), " exists)");
  if (ec) return fail(errc::io, "cannot check ", config.string(), ": ", ec.message());

  std::filesystem::create_directories(run.checkpoints_dir(), ec);
  if (ec)
    return fail(errc::io, "cannot create ", run.checkpoints_dir().string(), ": ", ec.message());

  // Make the new directory entries survive a crash: the run's own entries, then its name in root.
  if (auto ok = fsync_directory(dir); !ok) return ok.error();
  std::filesystem::path parent = dir.parent_path();
  if (parent.empty()) parent = ".";
  if (auto ok = fsync_directory(parent); !ok) return ok.error();
  return run;
}

result<run_directory> run_directory::open(const std::filesystem::path& dir) {
  if (dir.empty()) return fail(errc::invalid_arg, "run directory path is empty");
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return fail(errc::not_found, "run directory ", dir.string(), " does not exist");
  // Checked before locking so that opening a wrong directory leaves no run.lock behind in it.
  const std::filesystem::path config = dir / "config.yaml";
  if (!std::filesystem::exists(config, ec)) {
    if (ec) return fail(errc::io, "cannot check ", config.string(), ": ", ec.message());
    return fail(errc::not_found, config.string(), ": no such file (not a run directory)");
  }
  auto lock = take_lock(dir);
  if (!lock) return lock.error();
  return run_directory(dir, *lock);
}

run_directory::run_directory(run_directory&& other) noexcept
    : dir_(std::move(other.dir_)), lock_fd_(other.lock_fd_) {
  other.lock_fd_ = -1;
}

run_directory& run_directory::operator=(run_directory&& other) noexcept {
  if (this != &other) {
    if (lock_fd_ >= 0) ::close(lock_fd_);
    dir_ = std::move(other.dir_);
    lock_fd_ = other.lock_fd_;
    other.lock_fd_ = -1;
  }
  return *this;
}

run_directory::~run_directory() {
  // Closing the only descriptor of the lock's file description drops the flock. The pid stays
  // in run.lock; it is only trusted while the flock is held.
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

bool run_directory_locked(const std::filesystem::path& dir) {
  const std::filesystem::path lock_path = dir / "run.lock";
  int fd;
  do {
    fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return false;  // no lock file: no run was ever started here
  // A shared probe: it conflicts with a run's exclusive lock but not with another status
  // probe, so two concurrent `status` calls never see each other as a running run.
  bool locked = false;
  if (flock_retry(fd, LOCK_SH | LOCK_NB) != 0) {
    locked = errno == EWOULDBLOCK;
  } else {
    ::flock(fd, LOCK_UN);
  }
  ::close(fd);
  return locked;
}

} // namespace crucible::storage
