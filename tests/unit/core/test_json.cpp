#include <doctest/doctest.h>

#include <cmath>
#include <limits>

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
  CHECK(out == "\"ok \xc3\xa9 bad \\ufffd end\"");
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
