// tests/unit/storage/storage_test_util.hpp: a private temp directory per test, and child-process
// helpers for the crash and lock tests.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace crucible::storage::test {

/// A fresh directory under the system temp dir (mkdtemp), removed with its content on
/// destruction. Not copyable.
class temp_dir final {
public:
  temp_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "crucible-storage-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const noexcept { return path_; }

private:
  std::filesystem::path path_;
};

/// waitpid that retries EINTR; returns the raw status, or -1 on failure.
inline int wait_child(pid_t pid) {
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  return r == pid ? status : -1;
}

/// Number of entries directly in `dir`.
inline std::size_t entry_count(const std::filesystem::path& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

} // namespace crucible::storage::test
