// tests/test_util/safetensors_floats.hpp: the float32 tensors of a safetensors file's bytes, by
// name, and the largest difference between two such files (the tiny preset trains in float32):
// for tests that compare the weights two runs wrote without linking the policy library.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/json_parse.hpp"

namespace crucible::testing {

inline std::map<std::string, std::vector<float>> float_tensors(const std::string& bytes) {
  REQUIRE(bytes.size() >= 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  auto header = crucible::parse_json(bytes.substr(8, n));
  REQUIRE(header.ok());
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, entry] : header->as_object()) {
    if (name == "__metadata__")
      continue;
    REQUIRE(entry.find("dtype")->as_string() == "F32");
    const auto& offsets = entry.find("data_offsets")->as_array();
    const auto begin = static_cast<std::size_t>(offsets.at(0).as_int()), end = static_cast<std::size_t>(offsets.at(1).as_int());
    std::vector<float> values((end - begin) / sizeof(float));
    std::memcpy(values.data(), bytes.data() + 8 + n + begin, end - begin);
    out[name] = std::move(values);
  }
  return out;
}

/// The largest difference between the float32 tensors of two safetensors files' bytes; every
/// tensor of one must be in the other, with the same size.
inline double max_float_diff(const std::string& a, const std::string& b) {
  auto x = float_tensors(a), y = float_tensors(b);
  REQUIRE(x.size() == y.size());
  double worst = 0;
  for (const auto& [name, values] : x) {
    INFO(name);
    REQUIRE(y.count(name) == 1);
    REQUIRE(y[name].size() == values.size());
    for (std::size_t i = 0; i < values.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(values[i] - y[name][i])));
  }
  return worst;
}

} // namespace crucible::testing
