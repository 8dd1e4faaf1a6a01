// tests/test_util/read_text.hpp: a source file of the checkout (task, candidate) as text; a file
// that cannot be read fails the test instead of passing on as empty source.
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "core/file_io.hpp"

namespace crucible::testing {

inline std::string read_text(const std::filesystem::path& path) {
  auto text = read_file(path);
  if (!text)
    FAIL(text.error().message);
  return std::move(*text);
}

} // namespace crucible::testing
