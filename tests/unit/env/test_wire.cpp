// How the evaluator reads its workers' messages (env/eval/wire.hpp): strict JSON, every field checked,
// a missing field told apart from one of the wrong type, errors that name the field.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "env/eval/wire.hpp"

using namespace crucible::env;

TEST_CASE("wire: fields, lists and objects are read as they were sent") {
  auto n = wire::parse(R"({"type": "sampled", "calls": 3, "ms": 1.5, "ok": true, "pid": 4294967296,
                          "outputs": [{"dtype": "float32", "shape": [2, 3]}], "host_ms": {"run": 0.25, "copy": 1}})");
  CHECK(n.is_object());
  CHECK(n["type"].as<std::string>() == "sampled");
  CHECK(n["calls"].as<int>() == 3);
  CHECK(n["calls"].as<double>() == 3.0);
  CHECK(n["ms"].as<double>() == 1.5);
  CHECK(n["ok"].as<bool>());
  CHECK(n["pid"].as<std::int64_t>() == 4294967296LL);
  REQUIRE(n["outputs"].is_list());
  CHECK(n["outputs"].size() == 1);
  std::int64_t elements = 1;
  for (const auto& d : n["outputs"][0]["shape"])
    elements *= d.as<std::int64_t>();
  CHECK(elements == 6);
  std::string steps;
  for (const auto& [step, ms] : n["host_ms"].fields())
    steps += step + "=" + ms.as<std::string>() + ";";
  CHECK(steps == "copy=1;run=0.25;"); // in the keys' order
  // A view outlives the message it came from: it shares the parsed message.
  wire::node kept;
  {
    auto m = wire::parse(R"({"trial": 7})");
    kept = m["trial"];
  }
  CHECK(kept.as<int>() == 7);
}

TEST_CASE("wire: a missing field, a null and a field of the wrong type") {
  auto n = wire::parse(R"({"type": "done", "none": null, "calls": "many", "neg": -1, "big": 300, "list": [1]})");
  CHECK_FALSE(n["absent"].defined());
  CHECK(n["none"].defined());
  CHECK(n["none"].is_null());
  CHECK_FALSE(n["none"].is_scalar());
  CHECK(n["absent"].as<int>(5) == 5);
  CHECK(n["none"].as<int>(5) == 5);
  CHECK(n["calls"].as<int>(5) == 5); // of another type: the fallback
  CHECK_THROWS_WITH_AS(n["absent"].as<int>(), "the message has no field .absent", wire::error);
  CHECK_THROWS_WITH_AS(n["calls"].as<int>(), "the field .calls is not an integer", wire::error);
  CHECK_THROWS_WITH_AS(n["neg"].as<std::uint64_t>(), "the field .neg is negative", wire::error);
  CHECK_THROWS_WITH_AS(n["big"].as<std::int8_t>(), "the field .big is out of range", wire::error);
  CHECK_THROWS_WITH_AS(n["type"].as<bool>(), "the field .type is not a boolean", wire::error);
  CHECK_THROWS_WITH_AS(n["list"].as<std::string>(), "the field .list is not a string", wire::error);
  // Reading into what is not an object or a list gives undefined values, not a crash.
  CHECK_FALSE(n["type"]["inner"].defined());
  CHECK_FALSE(n["list"][5].defined());
  CHECK(n["type"].size() == 0);
  CHECK_THROWS_WITH_AS(n["list"][5].as<double>(), "the message has no field .list[5]", wire::error);
}

TEST_CASE("wire: text that is not strict JSON is refused with the parser's word") {
  CHECK_THROWS_AS(wire::parse("{\"type\": "), wire::error);
  CHECK_THROWS_AS(wire::parse("{\"ms\": NaN}"), wire::error); // Python's json.dumps would write it; the harness does not
  CHECK_THROWS_AS(wire::parse("type: sampled"), wire::error); // YAML, not JSON
  CHECK_THROWS_WITH_AS(wire::parse("nope"), "not JSON: nope", wire::error);
}

// Read through core/json_parse's json_value: what nlohmann/json's own tree did, kept.
TEST_CASE("wire: a key given twice means its last value, and fields() lists it once") {
  auto n = wire::parse(R"({"b": 1, "a": 2, "b": 3})");
  CHECK(n["b"].as<int>() == 3);
  std::string seen;
  for (const auto& [key, value] : n.fields())
    seen += key + "=" + value.as<std::string>() + ";";
  CHECK(seen == "a=2;b=3;");
  CHECK(n["b"].where() == "the field .b");
}

TEST_CASE("wire: integers up to 2^64 - 1 read exactly, and numbers read as text keep nlohmann's layout") {
  auto n = wire::parse(R"({"max": 18446744073709551615, "over": 18446744073709551616, "neg": -5, "x": [3.0, 0.25,
                          1e-05, 0.0001, 100000.0, 1e15, 1e+16, -0.0, 1.5e300, 123456789.125]})");
  CHECK(n["max"].as<std::uint64_t>() == UINT64_MAX);
  CHECK(n["max"].as<std::string>() == "18446744073709551615");
  CHECK_THROWS_WITH_AS(n["max"].as<std::int64_t>(), "the field .max is out of range", wire::error);
  CHECK_THROWS_WITH_AS(n["over"].as<std::uint64_t>(), "the field .over is not an integer", wire::error);
  CHECK(n["over"].as<double>() == 18446744073709551616.0);
  CHECK(n["neg"].as<std::string>() == "-5");
  CHECK(n["neg"].as<std::int8_t>() == -5);
  std::string text;
  for (const auto& x : n["x"])
    text += x.as<std::string>() + " ";
  CHECK(text == "3.0 0.25 1e-05 0.0001 100000.0 1e+15 1e+16 -0.0 1.5e+300 123456789.125 ");
  CHECK(wire::parse("true").as<std::string>() == "true");
  CHECK(wire::parse("[1]").is_list());
  CHECK(wire::parse("\"s\"").is_scalar());
  CHECK(wire::parse("{}").fields().empty());
}

TEST_CASE("wire: a large message is read in linear time") {
  // 200,000 items of a list, each an object of a few fields: reading them all stays well under a
  // second (an index into a list is constant time; fields are scanned, and objects are small).
  std::string text = R"({"type": "outputs", "items": [)";
  for (int i = 0; i < 200000; ++i)
    text += (i ? "," : "") + std::string{R"({"dtype": "float32", "shape": [2, )"} + std::to_string(i) + "]}";
  text += "]}";
  const auto t0 = std::chrono::steady_clock::now();
  auto n = wire::parse(text);
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < n["items"].size(); ++i)
    sum += n["items"][i]["shape"][1].as<std::int64_t>();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CHECK(sum == 199999LL * 200000 / 2);
  MESSAGE("read ", text.size() / 1e6, " MB in ", ms, " ms");
  CHECK(ms < 3000);
}

TEST_CASE("wire: nesting deeper than 512 levels is not JSON to the evaluator") {
  CHECK_THROWS_AS(wire::parse(std::string(600, '[') + std::string(600, ']')), wire::error);
  CHECK(wire::parse(std::string(100, '[') + std::string(100, ']')).is_list());
}
