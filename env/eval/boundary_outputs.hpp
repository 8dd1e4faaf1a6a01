// env/eval/boundary_outputs.hpp (internal to env/eval): how the boundary reads an output a worker
// describes after a timed sample (its dtype, shape, strides and span) and gathers its elements in
// row-major order. What a worker says is data: every field is checked. env/eval/boundary.cpp and
// env/eval/boundary_device.cpp use it; env/eval/boundary_outputs.cpp holds it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "env/eval/compare.hpp"
#include "env/eval/wire.hpp"

namespace crucible::env {

// One output as a worker described it after `go`: dtype, shape, strides, and the span from its
// first element to its last (what is read).
struct output_desc {
  tensor_blob blob; // dtype and shape; bytes not read yet
  std::vector<std::int64_t> strides;
  std::uint64_t bytes = 0; // its elements' bytes
  std::uint64_t span = 0;  // bytes from its first element to its last
  bool contiguous = true;
};

// Empty on success, else what is wrong (for "broke the protocol: ...").
std::string parse_output(const wire::node& d, output_desc& o);

// The output's elements in row-major order, gathered from `raw` (its span) by its strides.
std::vector<std::byte> gather(const output_desc& o, const std::byte* raw);

} // namespace crucible::env
