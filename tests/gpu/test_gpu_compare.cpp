// The outputs' scale rule (atol_for_scale) on the device: the evaluator's comparison kernel
// measures the reference's scale itself and must judge every pair as the host comparison does,
// with the same messages (docs/evaluator.md, Correctness). Part of test_gpu_evaluator's binary;
// needs nothing but the CUDA runtime (no worker, no torch).
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "env/eval/compare.hpp"
#include "env/eval/device/device_bytes.hpp"
#include "tests/gpu/uploaded.hpp"

using namespace crucible::env;
using crucible::testing::uploaded;

namespace {


tensor_blob host_f32(const std::vector<float>& v) {
  tensor_blob b;
  b.type = dtype::f32;
  b.shape = {static_cast<std::int64_t>(v.size())};
  b.bytes.resize(v.size() * 4);
  std::memcpy(b.bytes.data(), v.data(), b.bytes.size());
  return b;
}

tensor_blob device_f32(const std::vector<float>& v) {
  auto b = host_f32(v);
  b.device = std::make_shared<uploaded>(b.bytes);
  b.bytes.clear();
  return b;
}

std::vector<float> randn(size_t n, unsigned seed) {
  std::mt19937 rng{seed};
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (auto& x : v)
    x = normal(rng);
  return v;
}

// want/got compared on the host, on the device one at a time, on the device in a batch, and
// mixed (device reference, host candidate): one verdict, one message, one scale note.
comparison same_everywhere(const std::vector<float>& want, const std::vector<float>& got, double slack = 0) {
  tolerances tol;
  auto hw = host_f32(want), dw = device_f32(want);
  hw.slack = dw.slack = slack;
  const std::vector<tensor_blob> want_dev{dw}, got_dev{device_f32(got)};
  auto host = compare_outputs({hw}, {host_f32(got)}, tol);
  auto dev = compare_outputs(want_dev, got_dev, tol);
  auto mixed = compare_outputs(want_dev, {host_f32(got)}, tol);
  const auto ahead = compare_on_device_ahead({{&want_dev, &got_dev}}, tol);
  CHECK(ahead.size() == 1);
  auto batched = compare_outputs(want_dev, got_dev, tol, &ahead);
  INFO("host: " << host.message << " | device: " << dev.message);
  for (const auto* c : {&dev, &mixed, &batched}) {
    CHECK(c->ok == host.ok);
    CHECK(c->message == host.message);
    CHECK(c->scale_note == host.scale_note);
    CHECK(c->mismatches == host.mismatches);
    CHECK(c->max_abs_diff == host.max_abs_diff);
  }
  return host;
}

} // namespace

TEST_CASE("on the device, a normalised output estimated from a sample fails and the exact one passes, as on the host") {
  REQUIRE(device_bytes_available());
  const size_t n = 1 << 20;
  const auto x = randn(n, 2);
  double exact = 0;
  float blocked[1024] = {};
  for (size_t i = 0; i < n; ++i) {
    exact += static_cast<double>(x[i]) * x[i];
    blocked[i % 1024] += x[i] * x[i];
  }
  float sample = 0, legit = 0;
  size_t taken = 0;
  for (size_t i = 0; i < n; i += 100, ++taken)
    sample += x[i] * x[i];
  for (float b : blocked)
    legit += b;
  const float estimate = std::sqrt(sample * static_cast<float>(n) / static_cast<float>(taken));
  std::vector<float> want(n), hack(n), reordered(n);
  for (size_t i = 0; i < n; ++i) {
    want[i] = static_cast<float>(x[i] / std::sqrt(exact));
    hack[i] = x[i] / estimate;
    reordered[i] = x[i] / std::sqrt(legit);
  }
  auto bad = same_everywhere(want, hack);
  CHECK_FALSE(bad.ok);
  CHECK(bad.message.find("the tolerance is judged relative to the outputs (atol 0.0001 -> ") != std::string::npos);
  auto good = same_everywhere(want, reordered);
  CHECK(good.ok);
  CHECK(good.scale_note.find("output 0: values ~0.000977 (RMS)") == 0);
  // The slack is still added after the rule on the device.
  auto slackened = same_everywhere(want, hack, 1e-4);
  CHECK(slackened.ok);
}

TEST_CASE("on the device, half zeros and the rest of order one keep today's tolerance") {
  REQUIRE(device_bytes_available());
  auto want = randn(1 << 18, 3);
  for (auto& v : want)
    v = std::max(v, 0.0f);
  auto got = want;
  for (auto& v : got)
    if (v == 0)
      v = 5e-5f; // within atol 1e-4: passes as before the rule
  auto c = same_everywhere(want, got);
  CHECK(c.ok);
  CHECK(c.scale_note.empty());
  for (auto& v : got)
    if (v == 5e-5f)
      v = 2e-4f;
  CHECK_FALSE(same_everywhere(want, got).ok);
}

TEST_CASE("on the device, the scale is measured on the reference alone, over its finite elements") {
  REQUIRE(device_bytes_available());
  auto want = randn(1 << 16, 4);
  for (auto& v : want)
    v *= 1e-5f;
  want[7] = std::numeric_limits<float>::quiet_NaN();
  want[9] = std::numeric_limits<float>::infinity();
  auto got = want;
  for (auto& v : got)
    v *= 1.02f;
  // 2% off on tiny outputs: within atol 1e-4, not within the outputs' own scale.
  auto c = same_everywhere(want, got);
  CHECK_FALSE(c.ok);
  // measure_output_scale reads device bytes with the same kernel and agrees with the host.
  tolerances tol;
  auto host = measure_output_scale(host_f32(want), tol);
  auto dev = measure_output_scale(device_f32(want), tol);
  REQUIRE(host.ok());
  REQUIRE(dev.ok());
  CHECK(dev->finite == want.size() - 2);
  CHECK(dev->finite == host->finite);
  CHECK(dev->rms == doctest::Approx(host->rms).epsilon(1e-12));
  CHECK(dev->share_under_atol == host->share_under_atol);
  CHECK(dev->scaled);
  CHECK(host->scaled);
  CHECK(within_tolerance_line({device_f32(want)}, tol) == within_tolerance_line({host_f32(want)}, tol));
}
