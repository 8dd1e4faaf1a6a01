// How the evaluator reads its workers' messages (env/eval/wire.hpp): strict JSON, every field checked,
// a missing field told apart from one of the wrong type, errors that name the field.
#include <doctest/doctest.h>

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
