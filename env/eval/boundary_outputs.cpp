// env/eval/boundary_outputs.cpp: reading an output a worker describes (env/eval/boundary_outputs.hpp).
#include "env/eval/boundary_outputs.hpp"

#include <algorithm>
#include <cstring>

namespace crucible::env {

// Empty on success, else what is wrong (for "broke the protocol: ...").
std::string parse_output(const wire::node& d, output_desc& o) {
  auto type = parse_dtype(d["dtype"].as<std::string>(""));
  if (!type)
    return "an output of unknown dtype";
  tensor_blob& b = o.blob;
  b.type = *type;
  for (const auto& x : d["shape"])
    b.shape.push_back(x.as<std::int64_t>());
  o.bytes = d["bytes"].as<std::uint64_t>(0);
  if (std::any_of(b.shape.begin(), b.shape.end(), [](std::int64_t x) { return x < 0; })
      || o.bytes != static_cast<std::uint64_t>(b.numel()) * element_size(b.type))
    return "an output's size does not match its shape";
  // Its strides, as the worker's tensor has them (a view of a larger buffer, a transpose): the
  // span from its first element to its last is what it occupies, and what is read.
  for (const auto& x : d["strides"])
    o.strides.push_back(x.as<std::int64_t>(0));
  if (o.strides.empty() && !b.shape.empty()) { // contiguous
    o.strides.assign(b.shape.size(), 1);
    for (std::size_t j = b.shape.size(); j-- > 1;)
      o.strides[j - 1] = o.strides[j] * b.shape[j];
  }
  if (o.strides.size() != b.shape.size()
      || std::any_of(o.strides.begin(), o.strides.end(), [](std::int64_t x) { return x < 0; }))
    return "an output's strides do not match its shape";
  std::uint64_t last = 0; // the offset of its last element, in elements
  for (std::size_t j = 0; j < b.shape.size(); ++j)
    if (b.shape[j] > 0)
      last += static_cast<std::uint64_t>(b.shape[j] - 1) * static_cast<std::uint64_t>(o.strides[j]);
  o.span = o.bytes == 0 ? 0 : (last + 1) * element_size(b.type);
  if (o.span > 4 * o.bytes + (64ull << 20))
    return "an output's strides spread it over far more memory than its elements take";
  o.contiguous = true;
  for (std::int64_t j = static_cast<std::int64_t>(b.shape.size()) - 1, want = 1; j >= 0; --j) {
    if (b.shape[static_cast<std::size_t>(j)] > 1 && o.strides[static_cast<std::size_t>(j)] != want)
      o.contiguous = false;
    want *= b.shape[static_cast<std::size_t>(j)];
  }
  return {};
}

// The output's elements in row-major order, gathered from `raw` (its span) by its strides.
std::vector<std::byte> gather(const output_desc& o, const std::byte* raw) {
  const auto& b = o.blob;
  const auto esize = element_size(b.type);
  std::vector<std::byte> out(o.bytes);
  std::vector<std::int64_t> idx(b.shape.size(), 0);
  const auto n = static_cast<std::uint64_t>(b.numel());
  for (std::uint64_t e = 0; e < n; ++e) {
    std::uint64_t off = 0;
    for (std::size_t j = 0; j < idx.size(); ++j)
      off += static_cast<std::uint64_t>(idx[j]) * static_cast<std::uint64_t>(o.strides[j]);
    std::memcpy(out.data() + e * esize, raw + off * esize, esize);
    for (std::size_t j = idx.size(); j-- > 0;) {
      if (++idx[j] < b.shape[j])
        break;
      idx[j] = 0;
    }
  }
  return out;
}

} // namespace crucible::env
