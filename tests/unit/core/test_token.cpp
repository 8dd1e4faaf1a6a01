// core/token.hpp: token files are created private with a fresh secret, and read back only when
// nobody but their owner (and group) may read or write them.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "core/token.hpp"
#include "tests/test_util/temp_dir.hpp"

using namespace crucible;
namespace fs = std::filesystem;

TEST_CASE("a created token file is private, fresh each time, and reads back") {
  crucible::testing::temp_dir tmp;
  auto a = create_token_file(tmp.path() / "a");
  auto b = create_token_file(tmp.path() / "b");
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->size() == 64);
  CHECK(a->find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(*a != *b);
  CHECK((fs::status(tmp.path() / "a").permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write));
  auto back = read_token_file(tmp.path() / "a");
  REQUIRE(back);
  CHECK(*back == *a);
  auto again = create_token_file(tmp.path() / "a"); // never overwrites a token in use
  REQUIRE_FALSE(again);
  CHECK(again.error().code == errc::busy);
  CHECK(read_token_file(tmp.path() / "a").value() == *a);
}

TEST_CASE("reading a token file: first line trimmed, group access allowed, others refused") {
  crucible::testing::temp_dir tmp;
  auto file = tmp.path() / "token";
  std::ofstream{file} << "  s3cret \nsecond line\n";
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  auto t = read_token_file(file);
  REQUIRE_MESSAGE(t, t.error().to_string());
  CHECK(*t == "s3cret");

  fs::permissions(file, fs::perms::others_read, fs::perm_options::add);
  auto open = read_token_file(file);
  REQUIRE_FALSE(open);
  CHECK(open.error().code == errc::invalid_arg);
  CHECK(open.error().message == file.string() + ": the token file may be read or written by others (mode 644); chmod 600 " + file.string());

  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_write);
  CHECK(read_token_file(file).error().code == errc::invalid_arg);

  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write);
  std::ofstream{file} << "\n";
  CHECK(read_token_file(file).error().code == errc::invalid_arg);
  auto missing = read_token_file(tmp.path() / "none");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == errc::not_found);
  CHECK(missing.error().message == (tmp.path() / "none").string() + ": no such token file");
}
