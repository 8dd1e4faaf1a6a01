#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "core/json.hpp"

using crucible::json_writer;

TEST_CASE("json_writer nests objects and arrays with commas in the right places") {
  json_writer w;
  w.begin_object()
    .field("a", 1)
    .field("b", std::string{"x"})
    .key("c").begin_array().value(true).value(false).null().end_array()
    .key("d").begin_object().end_object()
    .end_object();
  CHECK(w.str() == R"({"a":1,"b":"x","c":[true,false,null],"d":{}})");
}

TEST_CASE("json_writer writes raw values as given, with the commas around them") {
  json_writer w;
  w.begin_object().key("ids").raw("[1,2]").field("n", 3).key("tags").raw(R"(["a"])").end_object();
  CHECK(w.str() == R"({"ids":[1,2],"n":3,"tags":["a"]})");
  json_writer a;
  a.begin_array().raw("{}").raw("null").end_array();
  CHECK(a.str() == "[{},null]");
}

TEST_CASE("json strings escape quotes, control characters and invalid UTF-8") {
  std::string out;
  crucible::append_json_string(out, "q\"b\\n\n\t\x01");
  CHECK(out == R"("q\"b\\n\n\t\u0001")");
  out.clear();
  crucible::append_json_string(out, "ok \xc3\xa9 bad \xff end");
  CHECK(out == "\"ok \xc3\xa9 bad \xef\xbf\xbd end\""); // U+FFFD
}

TEST_CASE("non-finite numbers become null, finite ones round-trip") {
  json_writer w;
  w.begin_array()
    .value(std::numeric_limits<double>::quiet_NaN())
    .value(std::numeric_limits<double>::infinity())
    .value(0.1)
    .value(std::uint64_t{18446744073709551615ull})
    .value(std::int64_t{-5})
    .end_array();
  CHECK(w.str() == "[null,null,0.1,18446744073709551615,-5]");
}

#include "core/sha256.hpp"

TEST_CASE("sha256 matches the FIPS 180-4 test vectors") {
  CHECK(crucible::sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(crucible::sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(crucible::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")
        == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  crucible::sha256 h;
  std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i)
    h.update(chunk);
  auto d = h.finish();
  CHECK(d[0] == 0xcd);
  CHECK(d[1] == 0xc7);
  CHECK(d[31] == 0xd0); // sha256 of one million 'a': cdc76e5c...c7112cd0
}

TEST_CASE("sha256 gives the same digest whole and in pieces, across block boundaries") {
  // Digests from Python's hashlib of bytes (31 i + 7) mod 256; on x86 with the SHA extensions
  // whole blocks take that path, the pieces the buffered one.
  const std::pair<std::size_t, const char*> expected[] = {
    {55, "8aa994584139d128848eeebc4e815639ba5ab6e6e39574195a63ac4f14f7c43b"},
    {56, "ad574708f75c044c9b85de64cb568ee7711ff4f36448c6242f053ba8f6cc2b63"},
    {63, "280ed3e8ff1df845b2e7dfe6ac6cee817bef20e783cc65abc41b818b4d2fe076"},
    {64, "c6ab9724ade5b6a7a1edfffb12f3aa9181351355af8fd08c919952ad211339dd"},
    {65, "788367c73c7ddf4c53f65e68cc0d943e6227ab55b0e78ba63ace822b1c6301c0"},
    {127, "192409cd280e14b743642ad1343fbd3e82d9305de72c078117745a679210cc3d"},
    {128, "cc548ca2dec1f6fe4f58b2e27aa9c7521607df1130d140b55a4dad0665302356"},
    {129, "81e89a7b2911aaa7795f9e3d4910cb47d6cd2b00d83b8399481527261a1a7519"},
    {1000, "5097e7d587352f5097062ae679f37bda5802d9f875aba14c8cb4d1a188ada179"},
    {65537, "74f3260f4a9adaf7271c910ba2d111dbae7a176afb487e1b7f655897eadf1093"}};
  auto hex = [](const std::array<std::uint8_t, 32>& d) {
    std::string s;
    for (auto b : d) {
      s += "0123456789abcdef"[b >> 4];
      s += "0123456789abcdef"[b & 15];
    }
    return s;
  };
  for (const auto& [n, digest] : expected) {
    std::string bytes(n, '\0');
    for (std::size_t i = 0; i < n; ++i)
      bytes[i] = static_cast<char>((i * 31 + 7) % 256);
    CAPTURE(n);
    CHECK(crucible::sha256_hex(bytes) == digest);
    crucible::sha256 pieces;
    for (std::size_t at = 0; at < n; at += 13)
      pieces.update(bytes.data() + at, std::min<std::size_t>(13, n - at));
    CHECK(hex(pieces.finish()) == digest);
  }
}
