#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "env/compare.hpp"
#include "env/device_bytes.hpp"

using namespace crucible::env;

namespace {

tensor_blob f32(std::vector<std::int64_t> shape, std::vector<float> values) {
  tensor_blob b;
  b.type = dtype::f32;
  b.shape = std::move(shape);
  b.bytes.resize(values.size() * 4);
  std::memcpy(b.bytes.data(), values.data(), b.bytes.size());
  return b;
}

// Device bytes on a device that no machine has: every device call on them fails in this
// process, as one would when the evaluator's device runs out of memory.
class absent_device final : public device_bytes {
public:
  const void* data() const noexcept override { return nullptr; }
  std::uint64_t size() const noexcept override { return 16; }
  int device() const noexcept override { return 999; }
};

tensor_blob on_absent_device() {
  tensor_blob b;
  b.type = dtype::f32;
  b.shape = {4};
  b.device = std::make_shared<absent_device>();
  return b;
}

} // namespace

TEST_CASE("outputs within tolerance match, outside do not, with the first offending element named") {
  tolerances tol;
  auto want = f32({2, 2}, {1.0f, 2.0f, 3.0f, 4.0f});
  CHECK(compare_outputs({want}, {f32({2, 2}, {1.00005f, 2.0f, 3.0f, 4.0f})}, tol).ok);
  auto bad = compare_outputs({want}, {f32({2, 2}, {1.0f, 2.0f, 3.01f, 4.0f})}, tol);
  CHECK_FALSE(bad.ok);
  CHECK(bad.mismatches == 1);
  CHECK(bad.message.find("first at flat index 2") != std::string::npos);
  CHECK(bad.max_abs_diff == doctest::Approx(0.01).epsilon(0.01));
}

TEST_CASE("relative tolerance scales with the reference magnitude") {
  tolerances tol;
  auto want = f32({1}, {10000.0f});
  CHECK(compare_outputs({want}, {f32({1}, {10000.9f})}, tol).ok);   // 0.9 <= 1e-4 + 1e-4 * 1e4
  CHECK_FALSE(compare_outputs({want}, {f32({1}, {10001.5f})}, tol).ok);
}

TEST_CASE("the reference's rounding error widens atol for its own output only, and the message says by how much") {
  tolerances tol; // float32: atol 1e-4, rtol 1e-4
  auto want = f32({3}, {0.0f, 1.0f, 2.0f});
  auto got = f32({3}, {0.0f, 1.0f, 2.0f + 9e-4f}); // beyond atol + rtol * 2 = 3e-4
  std::vector<tensor_blob> w{want}, g{got};
  CHECK_FALSE(compare_outputs(w, g, tol).ok);
  w[0].slack = 8 * 1e-4; // rounding_factor 8 times a rounding error of 1e-4
  auto c = compare_outputs(w, g, tol);
  CHECK(c.ok);
  w[0].slack = 8 * 5e-5; // 4e-4 more: 7e-4 in all, still short of 9e-4
  c = compare_outputs(w, g, tol);
  CHECK_FALSE(c.ok);
  CHECK(c.message.find("for the reference's own rounding error") != std::string::npos);
  // The slack is the reference's: as the other side of a comparison it widens nothing.
  std::vector<tensor_blob> g2{got}, w2{want};
  g2[0].slack = 1;
  CHECK_FALSE(compare_outputs(w2, g2, tol).ok);
  // Integer outputs stay exact whatever the slack.
  tensor_blob a, b;
  a.type = b.type = dtype::i64;
  a.shape = b.shape = {1};
  std::int64_t x = 5, y = 6;
  a.bytes.resize(8);
  b.bytes.resize(8);
  std::memcpy(a.bytes.data(), &x, 8);
  std::memcpy(b.bytes.data(), &y, 8);
  a.slack = 10;
  CHECK_FALSE(compare_outputs(std::vector<tensor_blob>{a}, std::vector<tensor_blob>{b}, tol).ok);
}

TEST_CASE("shape, dtype, count and kind must match exactly") {
  tolerances tol;
  auto want = f32({4}, {1, 2, 3, 4});
  CHECK(compare_outputs({want}, {f32({2, 2}, {1, 2, 3, 4})}, tol).message.find("shape [2, 2], expected [4]") != std::string::npos);
  auto half = want;
  half.type = dtype::f16;
  half.bytes.resize(8);
  CHECK(compare_outputs({want}, {half}, tol).message.find("dtype float16, expected float32") != std::string::npos);
  CHECK(compare_outputs({want}, {want, want}, tol).message == "2 outputs, expected 1");
  tensor_blob lazy;
  lazy.kind = "tensor subclass LazyTensor";
  CHECK(compare_outputs({want}, {lazy}, tol).message.find("not a plain tensor (tensor subclass LazyTensor)") != std::string::npos);
}

TEST_CASE("NaN matches only NaN, infinities match only themselves, poisoned memory fails") {
  tolerances tol;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(compare_outputs({f32({2}, {nan, inf})}, {f32({2}, {nan, inf})}, tol).ok);
  CHECK_FALSE(compare_outputs({f32({1}, {1.0f})}, {f32({1}, {nan})}, tol).ok);
  CHECK_FALSE(compare_outputs({f32({1}, {inf})}, {f32({1}, {-inf})}, tol).ok);
  tensor_blob poisoned = f32({1}, {0});
  std::memset(poisoned.bytes.data(), 0xFF, 4); // what the harness writes into freed outputs
  CHECK_FALSE(compare_outputs({f32({1}, {0.5f})}, {poisoned}, tol).ok);
}

TEST_CASE("half and bfloat16 decode exactly") {
  CHECK(half_to_float(0x3C00) == 1.0f);
  CHECK(half_to_float(0xC000) == -2.0f);
  CHECK(half_to_float(0x0001) == doctest::Approx(5.960464e-8f));
  CHECK(std::isinf(half_to_float(0x7C00)));
  CHECK(std::isnan(half_to_float(0x7E00)));
  CHECK(bfloat16_to_float(0x3F80) == 1.0f);
  CHECK(bfloat16_to_float(0x4049) == doctest::Approx(3.140625f));
}

TEST_CASE("integer outputs compare exactly") {
  tensor_blob a;
  a.type = dtype::i64;
  a.shape = {2};
  std::int64_t v[2] = {3, 4};
  a.bytes.resize(16);
  std::memcpy(a.bytes.data(), v, 16);
  auto b = a;
  v[1] = 5;
  std::memcpy(b.bytes.data(), v, 16);
  CHECK(compare_outputs({a}, {a}, {}).ok);
  CHECK_FALSE(compare_outputs({a}, {b}, {}).ok);
}

TEST_CASE("dtype names round-trip") {
  for (auto t : {dtype::f64, dtype::f32, dtype::f16, dtype::bf16, dtype::i64, dtype::i32, dtype::i16, dtype::i8,
                 dtype::u8, dtype::boolean})
    CHECK(parse_dtype(to_string(t)) == t);
  CHECK_FALSE(parse_dtype("complex64").has_value());
}

TEST_CASE("a comparison that fails in the evaluator's own process says so, the candidate's first problem comes first") {
  // Both on the device (the device comparison fails), and one on the device (the copy fails).
  for (const auto& got : {on_absent_device(), f32({4}, {1, 2, 3, 4})}) {
    auto r = compare_outputs({on_absent_device()}, {got}, tolerances{});
    CHECK_FALSE(r.ok);
    CHECK(r.evaluator_error);
    CHECK(r.message.find("output 0: cannot") != std::string::npos);
  }
  // A wrong value in output 0 is the candidate's, whatever happens to output 1.
  auto r = compare_outputs({f32({4}, {1, 2, 3, 4}), on_absent_device()}, {f32({4}, {1, 2, 3, 5}), on_absent_device()},
                           tolerances{});
  CHECK_FALSE(r.ok);
  CHECK_FALSE(r.evaluator_error);
  CHECK(r.message.find("output 0:") != std::string::npos);
  // And host bytes that match are no evaluator error.
  auto same = compare_outputs({f32({4}, {1, 2, 3, 4})}, {f32({4}, {1, 2, 3, 4})}, tolerances{});
  CHECK(same.ok);
  CHECK_FALSE(same.evaluator_error);
}
