// tests/unit/core/test_json_parse.cpp: JSON read through nlohmann/json into json_value: values,
// escapes, numbers, errors with line:column, and a round trip through json_writer.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "core/json.hpp"
#include "core/json_parse.hpp"

using namespace crucible;

namespace {

json_value parse_ok(std::string_view text) {
  auto r = parse_json(text, "t.json");
  INFO(text);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string{} : r.error().message));
  return std::move(r).value();
}

std::string parse_error(std::string_view text) {
  auto r = parse_json(text, "t.json");
  INFO(text);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::corrupt);
  return r.error().message;
}

} // namespace

TEST_CASE("parse_json reads every kind of value") {
  auto v = parse_ok(R"( {"a": [1, -2, 3.5, -0.25e2, 1E3], "b": {"c": null, "d": true, "e": false},
                        "s": "x", "empty": {}, "none": []} )");
  REQUIRE(v.is_object());
  const auto& a = v.find("a")->as_array();
  REQUIRE(a.size() == 5);
  CHECK(a[0].is_int());
  CHECK(a[0].as_int() == 1);
  CHECK(a[1].as_int() == -2);
  CHECK(a[2].type() == json_value::kind::real);
  CHECK(a[2].as_double() == 3.5);
  CHECK(a[3].as_double() == -25.0);
  CHECK(a[4].as_double() == 1000.0);
  CHECK(a[0].as_double() == 1.0);
  CHECK(v.find("b")->find("c")->is_null());
  CHECK(v.find("b")->find("d")->as_bool());
  CHECK_FALSE(v.find("b")->find("e")->as_bool());
  CHECK(v.find("s")->as_string() == "x");
  CHECK(v.find("empty")->as_object().empty());
  CHECK(v.find("none")->as_array().empty());
  CHECK(v.find("missing") == nullptr);
  CHECK(v.find("s")->find("x") == nullptr);
  // Object members keep document order.
  CHECK(v.as_object()[0].key == "a");
  CHECK(v.as_object().back().key == "none");
}

TEST_CASE("integers use int64 while they fit, doubles beyond") {
  CHECK(parse_ok("9223372036854775807").as_int() == INT64_MAX);
  CHECK(parse_ok("-9223372036854775808").as_int() == INT64_MIN);
  auto big = parse_ok("9223372036854775808");
  CHECK(big.type() == json_value::kind::real);
  CHECK(big.as_double() == doctest::Approx(9.223372036854775808e18));
  CHECK(parse_ok("1e-400").as_double() == 0.0);
  CHECK(parse_ok("-0").as_int() == 0);
}

TEST_CASE("integers beyond int64 read as doubles but keep their exact uint64 value") {
  auto max = parse_ok("18446744073709551615");
  CHECK(max.type() == json_value::kind::real);
  CHECK_FALSE(max.is_int());
  CHECK(max.is_number());
  REQUIRE(max.is_uint());
  CHECK(max.as_uint() == UINT64_MAX);
  CHECK(max.as_double() == doctest::Approx(1.8446744073709552e19));
  CHECK(to_json_text(max) == "18446744073709551615");
  CHECK(parse_ok("9223372036854775808").as_uint() == 9223372036854775808ull);
  CHECK(parse_ok("7").is_uint());
  CHECK(parse_ok("7").as_uint() == 7);
  CHECK(parse_ok("0").is_uint());
  CHECK_FALSE(parse_ok("-1").is_uint());
  CHECK_FALSE(parse_ok("1.0").is_uint());
  CHECK_FALSE(parse_ok("1e19").is_uint());             // an exponent: a double
  CHECK_FALSE(parse_ok("18446744073709551616").is_uint()); // beyond uint64: a double
  CHECK_FALSE(parse_ok("\"7\"").is_uint());
  CHECK(json_value{std::uint64_t{5}}.is_int());
  CHECK(json_value{std::uint64_t{5}}.as_int() == 5);
}

TEST_CASE("string escapes, \\u escapes and surrogate pairs decode to UTF-8") {
  CHECK(parse_ok(R"("q\"b\\s\/\b\f\n\r\t")").as_string() == "q\"b\\s/\b\f\n\r\t");
  CHECK(parse_ok(R"("\u0041\u00e9\u20AC")").as_string() == "A\xc3\xa9\xe2\x82\xac");
  CHECK(parse_ok(R"("\ud83d\ude00")").as_string() == "\xf0\x9f\x98\x80"); // U+1F600
  CHECK(parse_ok(R"("\u0000x")").as_string() == std::string("\0x", 2));
  CHECK(parse_ok("\"raw \xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80\"").as_string() ==
        "raw \xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80");
  // Long strings mixing runs of ASCII and escapes.
  std::string text = "\"";
  std::string want;
  for (int i = 0; i < 1000; ++i) {
    text += "abc\\n\\u00e9";
    want += "abc\n\xc3\xa9";
  }
  text += "\"";
  CHECK(parse_ok(text).as_string() == want);
}

TEST_CASE("malformed documents are refused with line and column") {
  // The position is crucible's FILE:LINE:COLUMN; the description is nlohmann/json's.
  CHECK(parse_error("{\"a\": 1,\n  \"b\": }") ==
        "t.json:2:8: syntax error while parsing value - unexpected '}'; expected '[', '{', or a literal");
  CHECK(parse_error("[1, 2,]").find("t.json:1:7:") == 0);
  CHECK(parse_error("{\"a\" 1}").find("expected ':'") != std::string::npos);
  CHECK(parse_error("{\"a\": 1,}").find("expected string literal") != std::string::npos);
  CHECK(parse_error("[1 2]").find("expected ']'") != std::string::npos);
  CHECK(parse_error("").find("unexpected end of input") != std::string::npos);
  CHECK(parse_error("  ").find("t.json:1:3:") == 0);
  CHECK(parse_error("[1] x").find("expected end of input") != std::string::npos);
  CHECK(parse_error("\"abc").find("missing closing quote") != std::string::npos);
  CHECK(parse_error("\"a\nb\"").find("control character") != std::string::npos);
  CHECK(parse_error("\"\\x\"").find("forbidden character after backslash") != std::string::npos);
  CHECK(parse_error("\"\\u12\"").find("4 hex digits") != std::string::npos);
  CHECK(parse_error("\"\\ud800\"").find("must be followed by U+DC00") != std::string::npos);
  CHECK(parse_error("\"\\ud800\\u0041\"").find("must be followed by U+DC00") != std::string::npos);
  CHECK(parse_error("\"\\udc00\"").find("must follow U+D800") != std::string::npos);
  CHECK(parse_error("\"\xff\"") .find("t.json:1:2: ") == 0);
  CHECK(parse_error("\"\xff\"").find("ill-formed UTF-8") != std::string::npos);
  CHECK(parse_error("\"\xc0\xaf\"").find("ill-formed UTF-8") != std::string::npos);     // overlong
  CHECK(parse_error("\"\xed\xa0\x80\"").find("ill-formed UTF-8") != std::string::npos); // surrogate
  CHECK(parse_error("\"\xe4\xb8\"").find("ill-formed UTF-8") != std::string::npos);     // cut off
  CHECK(parse_error("01").find("t.json:1:2:") == 0);                                     // leading zero
  CHECK(parse_error("1.").find("after '.'") != std::string::npos);
  CHECK(parse_error("1e").find("after exponent") != std::string::npos);
  CHECK(parse_error("-").find("expected digit after '-'") != std::string::npos);
  CHECK(parse_error("+1").find("invalid literal; last read: '+'") != std::string::npos);
  CHECK(parse_error("1e999").find("number overflow") != std::string::npos);
  CHECK(parse_error("NaN").find("last read: 'N'") != std::string::npos);
  CHECK(parse_error("tru").find("last read: 'tru'") != std::string::npos);
  CHECK(parse_error("// c\n1").find("last read: '/'") != std::string::npos);
  CHECK(parse_error("{'a': 1}").find("expected string literal") != std::string::npos);
}

TEST_CASE("duplicate keys are kept in order, find sees the first, and a byte-order mark is skipped") {
  auto v = parse_ok("\xef\xbb\xbf{\"k\": 1, \"k\": 2}");
  REQUIRE(v.as_object().size() == 2);
  CHECK(v.find("k")->as_int() == 1);
  CHECK(v.as_object()[1].value.as_int() == 2);
}

TEST_CASE("deep nesting is refused, not a stack overflow") {
  std::string deep(100000, '[');
  CHECK(parse_error(deep) == "t.json:1:513: nesting deeper than 512 levels");
  CHECK(parse_error("[\"[[\", " + deep).find("t.json:1:519: nesting") == 0); // brackets in strings do not count
  std::string ok = std::string(500, '[') + std::string(500, ']');
  CHECK(parse_ok(ok).is_array());
}

TEST_CASE("what json_writer writes, parse_json reads back") {
  json_writer w;
  w.begin_object()
    .field("name", std::string{"tab\there \"quoted\" \xc3\xa9\xf0\x9f\x98\x80"})
    .field("n", std::int64_t{-42})
    .field("x", 0.1)
    .key("list").begin_array().value(true).null().value("s").end_array()
    .end_object();
  auto v = parse_ok(w.str());
  CHECK(v.find("name")->as_string() == "tab\there \"quoted\" \xc3\xa9\xf0\x9f\x98\x80");
  CHECK(v.find("n")->as_int() == -42);
  CHECK(v.find("x")->as_double() == 0.1);
  CHECK(v.find("list")->as_array()[2].as_string() == "s");
}

TEST_CASE("read_json_file names the file in its errors and parses large files quickly") {
  namespace fs = std::filesystem;
  auto dir = fs::temp_directory_path() / ("crucible-json-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto missing = read_json_file(dir / "nope.json");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().code == errc::not_found);
  CHECK(missing.error().message.find("nope.json") != std::string::npos);

  std::ofstream(dir / "bad.json") << "{\n\n   \"k\": [1,,2]}";
  auto bad = read_json_file(dir / "bad.json");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message == (dir / "bad.json").string() + ":3:12: syntax error while parsing value - unexpected ','; expected '[', '{', or a literal");

  // A tokenizer.json-sized document: 150k vocabulary entries and 150k merges.
  std::string big = "{\"vocab\": {";
  for (int i = 0; i < 150000; ++i)
    big += (i ? "," : "") + std::string{"\"\\u0120tok"} + std::to_string(i) + "\":" + std::to_string(i);
  big += "}, \"merges\": [";
  for (int i = 0; i < 150000; ++i)
    big += (i ? "," : "") + std::string{"[\"\\u0120t\",\"ok"} + std::to_string(i) + "\"]";
  big += "]}";
  std::ofstream(dir / "big.json") << big;
  auto t0 = std::chrono::steady_clock::now();
  auto v = read_json_file(dir / "big.json");
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(v.ok());
  CHECK(v->find("vocab")->as_object().size() == 150000);
  CHECK(v->find("vocab")->as_object()[7].key == "\xc4\xa0tok7");
  CHECK(v->find("merges")->as_array()[9].as_array()[1].as_string() == "ok9");
  MESSAGE("parsed ", big.size() / 1e6, " MB in ", ms, " ms");
  CHECK(ms < 1000);
  fs::remove_all(dir);
}
