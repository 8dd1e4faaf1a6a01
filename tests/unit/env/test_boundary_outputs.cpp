// How the boundary reads an output a worker describes after a timed sample
// (env/eval/boundary_outputs.hpp): every field checked, the span its strides cover, row-major gathering.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "env/eval/boundary_outputs.hpp"

using namespace crucible::env;

namespace {

std::string parsed(const std::string& json, output_desc& o) {
  return parse_output(wire::parse(json), o);
}

} // namespace

TEST_CASE("boundary outputs: a contiguous output's size, span and strides") {
  output_desc o;
  CHECK(parsed(R"({"dtype": "float32", "shape": [2, 3], "bytes": 24})", o).empty());
  CHECK(o.contiguous);
  CHECK(o.span == 24);
  CHECK(o.strides == std::vector<std::int64_t>{3, 1});
  output_desc e;
  CHECK(parsed(R"({"dtype": "float32", "shape": [0, 3], "bytes": 0})", e).empty());
  CHECK(e.span == 0);
}

TEST_CASE("boundary outputs: a transposed output is read by its strides, in row-major order") {
  // A 2x3 view of a 3x2 buffer (its transpose): element (i, j) at i + 2 j.
  output_desc o;
  CHECK(parsed(R"({"dtype": "int32", "shape": [2, 3], "strides": [1, 2], "bytes": 24})", o).empty());
  CHECK_FALSE(o.contiguous);
  CHECK(o.span == 24);
  const std::int32_t raw[6] = {0, 10, 1, 11, 2, 12}; // buffer (3x2): rows (0,10), (1,11), (2,12)
  const auto out = gather(o, reinterpret_cast<const std::byte*>(raw));
  std::int32_t got[6];
  REQUIRE(out.size() == sizeof got);
  std::memcpy(got, out.data(), sizeof got);
  CHECK(std::vector<std::int32_t>(got, got + 6) == std::vector<std::int32_t>{0, 1, 2, 10, 11, 12});
}

TEST_CASE("boundary outputs: what a worker says is data, and a wrong field is named") {
  output_desc o;
  CHECK(parsed(R"({"dtype": "complex1024", "shape": [2], "bytes": 8})", o).find("unknown dtype") != std::string::npos);
  output_desc a;
  CHECK(parsed(R"({"dtype": "float32", "shape": [2, 3], "bytes": 20})", a).find("does not match its shape")
        != std::string::npos);
  output_desc b;
  CHECK(parsed(R"({"dtype": "float32", "shape": [-2, 3], "bytes": 24})", b).find("does not match its shape")
        != std::string::npos);
  output_desc c;
  CHECK(parsed(R"({"dtype": "float32", "shape": [2, 3], "strides": [1], "bytes": 24})", c).find("strides do not match")
        != std::string::npos);
  output_desc d;
  CHECK(parsed(R"({"dtype": "float32", "shape": [2, 3], "strides": [3, -1], "bytes": 24})", d).find("strides do not match")
        != std::string::npos);
  // Strides that spread six elements over far more memory than they take (a read of the worker's
  // whole address space, or of memory it does not own).
  output_desc f;
  CHECK(parsed(R"({"dtype": "float32", "shape": [2, 3], "strides": [1000000000, 1], "bytes": 24})", f)
          .find("far more memory") != std::string::npos);
}
