// tests/test_util/temp_dir.hpp: a fresh directory for one test, shared by every test folder.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace crucible::testing {

/// A fresh directory under the system temp dir (mkdtemp, so parallel tests never share one),
/// removed with its content on destruction. Not copyable.
class temp_dir final {
public:
  explicit temp_dir(const std::string& prefix = "crucible-test") {
    auto tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr)
      std::abort(); // a test machine without a writable temp dir cannot run these tests
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

} // namespace crucible::testing
