#include "env/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <tuple>

#include "env/device_bytes.hpp"

namespace crucible::env {

const char* to_string(dtype t) noexcept {
  switch (t) {
    case dtype::f64: return "float64";
    case dtype::f32: return "float32";
    case dtype::f16: return "float16";
    case dtype::bf16: return "bfloat16";
    case dtype::i64: return "int64";
    case dtype::i32: return "int32";
    case dtype::i16: return "int16";
    case dtype::i8: return "int8";
    case dtype::u8: return "uint8";
    case dtype::boolean: return "bool";
  }
  return "?";
}

std::optional<dtype> parse_dtype(std::string_view name) noexcept {
  for (auto t : {dtype::f64, dtype::f32, dtype::f16, dtype::bf16, dtype::i64, dtype::i32,
                 dtype::i16, dtype::i8, dtype::u8, dtype::boolean})
    if (name == to_string(t))
      return t;
  return std::nullopt;
}

bool is_floating(dtype t) noexcept {
  return t == dtype::f64 || t == dtype::f32 || t == dtype::f16 || t == dtype::bf16;
}

std::int64_t tensor_blob::numel() const noexcept {
  std::int64_t n = 1;
  for (auto d : shape)
    n *= d;
  return n;
}

tolerance tolerances::for_dtype(dtype t) const noexcept {
  switch (t) {
    case dtype::f64: return f64;
    case dtype::f32: return f32;
    case dtype::f16: return f16;
    case dtype::bf16: return bf16;
    default: return {0, 0};
  }
}

float half_to_float(std::uint16_t h) noexcept {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000) << 16;
  std::uint32_t exp = (h >> 10) & 0x1f;
  std::uint32_t mant = h & 0x3ff;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else { // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bfloat16_to_float(std::uint16_t b) noexcept {
  std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

double element_value(const std::byte* p, dtype t) noexcept {
  switch (t) {
    case dtype::f64: { double v; std::memcpy(&v, p, 8); return v; }
    case dtype::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case dtype::f16: { std::uint16_t v; std::memcpy(&v, p, 2); return half_to_float(v); }
    case dtype::bf16: { std::uint16_t v; std::memcpy(&v, p, 2); return bfloat16_to_float(v); }
    case dtype::i64: { std::int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case dtype::i32: { std::int32_t v; std::memcpy(&v, p, 4); return v; }
    case dtype::i16: { std::int16_t v; std::memcpy(&v, p, 2); return v; }
    case dtype::i8: { std::int8_t v; std::memcpy(&v, p, 1); return v; }
    case dtype::u8: case dtype::boolean: { std::uint8_t v; std::memcpy(&v, p, 1); return v; }
  }
  return 0;
}

namespace {

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void compare_one(size_t index, const tensor_blob& want, const tensor_blob& got,
                 const tolerances& tol, const device_differences* ahead, comparison& res) {
  auto name = "output " + std::to_string(index);
  auto fail = [&](std::string msg) {
    if (res.ok)
      res.message = name + ": " + msg;
    res.ok = false;
  };
  if (!got.kind.empty())
    return fail("not a plain tensor (" + got.kind + ")");
  if (!want.kind.empty())
    return fail("the reference returned " + want.kind);
  if (got.type != want.type)
    return fail(std::string{"dtype "} + to_string(got.type) + ", expected " + to_string(want.type));
  if (got.shape != want.shape)
    return fail("shape " + shape_str(got.shape) + ", expected " + shape_str(want.shape));
  auto n = static_cast<size_t>(want.numel());
  auto es = element_size(want.type);
  auto stored = [](const tensor_blob& b) { return b.device ? b.device->size() : b.bytes.size(); };
  if (stored(want) != n * es || stored(got) != n * es)
    return fail("byte count does not match shape and dtype");
  auto t = tol.for_dtype(want.type);
  if (t.atol > 0 || t.rtol > 0)
    t.atol += want.slack;
  auto report = [&](std::uint64_t bad, double worst, std::uint64_t first_bad, double g, double w) {
    res.max_abs_diff = std::max(res.max_abs_diff, worst);
    res.mismatches += bad;
    if (bad > 0) {
      char buf[320];
      char widened[96] = "";
      if (t.atol > 0 && want.slack > 0)
        std::snprintf(widened, sizeof widened, " (%g of it for the reference's own rounding error)", want.slack);
      std::snprintf(buf, sizeof buf,
                    "%llu of %zu elements outside atol=%g%s rtol=%g (max abs diff %.3g; first at flat index %llu: got %.6g, expected %.6g)",
                    static_cast<unsigned long long>(bad), n, t.atol, widened, t.rtol, worst,
                    static_cast<unsigned long long>(first_bad), g, w);
      fail(buf);
    }
  };
  if (want.device && got.device) {
    // Both on the device: the evaluator's own kernel compares them where they are.
    if (ahead != nullptr) {
      if (auto it = ahead->find({want.device.get(), got.device.get()}); it != ahead->end()) {
        const auto& d = it->second;
        return report(d.mismatches, d.max_abs_diff, d.first_bad, element_value(d.got_first, want.type),
                      element_value(d.want_first, want.type));
      }
    }
    auto d = device_compare(*want.device, *got.device, want.type, n, t);
    if (!d) {
      res.evaluator_error = res.ok; // only when it is the first problem found
      return fail("cannot compare on the device: " + d.error().message);
    }
    return report(d->mismatches, d->max_abs_diff, d->first_bad, element_value(d->got_first, want.type),
                  element_value(d->want_first, want.type));
  }
  // A device output beside a host one (a worker that could not export one): compare on the host.
  std::vector<std::byte> want_host, got_host;
  const std::vector<std::byte>* want_bytes = &want.bytes;
  const std::vector<std::byte>* got_bytes = &got.bytes;
  for (auto [blob, host, bytes] : {std::tuple{&want, &want_host, &want_bytes}, std::tuple{&got, &got_host, &got_bytes}}) {
    if (!blob->device)
      continue;
    auto copied = download(*blob->device);
    if (!copied) {
      res.evaluator_error = res.ok; // only when it is the first problem found
      return fail("cannot copy an output from the device: " + copied.error().message);
    }
    *host = std::move(*copied);
    *bytes = host;
  }
  const std::byte* wp = want_bytes->data();
  const std::byte* gp = got_bytes->data();
  std::uint64_t bad = 0;
  double worst = 0;
  size_t first_bad = n;
  for (size_t i = 0; i < n; ++i) {
    double w = element_value(wp + i * es, want.type);
    double g = element_value(gp + i * es, want.type);
    bool ok;
    if (std::isnan(w) || std::isnan(g)) {
      ok = std::isnan(w) && std::isnan(g);
    } else if (std::isinf(w) || std::isinf(g)) {
      ok = w == g;
    } else {
      double d = std::fabs(g - w);
      worst = std::max(worst, d);
      ok = d <= t.atol + t.rtol * std::fabs(w);
    }
    if (!ok) {
      if (first_bad == n)
        first_bad = i;
      ++bad;
    }
  }
  if (bad > 0)
    report(bad, worst, first_bad, element_value(gp + first_bad * es, want.type),
           element_value(wp + first_bad * es, want.type));
  else
    report(0, worst, 0, 0, 0);
}

} // namespace

device_differences compare_on_device_ahead(const std::vector<output_lists>& lists, const tolerances& tol) {
  std::vector<device_comparison> pairs;
  for (const auto& [want, got] : lists) {
    if (want == nullptr || got == nullptr)
      continue;
    for (size_t i = 0; i < std::min(want->size(), got->size()); ++i) {
      const auto& w = (*want)[i];
      const auto& g = (*got)[i];
      if (!w.device || !g.device || !w.kind.empty() || !g.kind.empty() || w.type != g.type || w.shape != g.shape)
        continue;
      const auto n = static_cast<std::uint64_t>(w.numel());
      const auto bytes = n * element_size(w.type);
      if (w.device->size() != bytes || g.device->size() != bytes)
        continue; // compare_one names the problem
      auto t = tol.for_dtype(w.type);
      if (t.atol > 0 || t.rtol > 0)
        t.atol += w.slack;
      pairs.push_back({w.device.get(), g.device.get(), w.type, n, t});
    }
  }
  device_differences out;
  if (pairs.empty())
    return out;
  auto diffs = device_compare_all(pairs);
  if (!diffs)
    return out; // compared one at a time, which reports the failure where it happens
  for (size_t i = 0; i < pairs.size(); ++i)
    out.emplace(std::pair{pairs[i].want, pairs[i].got}, (*diffs)[i]);
  return out;
}

comparison compare_outputs(const std::vector<tensor_blob>& want, const std::vector<tensor_blob>& got,
                           const tolerances& tol, const device_differences* ahead) {
  comparison res;
  if (want.size() != got.size()) {
    res.ok = false;
    res.message = std::to_string(got.size()) + " outputs, expected " + std::to_string(want.size());
    return res;
  }
  for (size_t i = 0; i < want.size(); ++i)
    compare_one(i, want[i], got[i], tol, ahead, res);
  return res;
}

} // namespace crucible::env
