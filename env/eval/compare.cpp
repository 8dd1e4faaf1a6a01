#include "env/eval/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <tuple>

#include "env/eval/device/device_bytes.hpp"

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

namespace {

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// A reference's scale from host bytes: the RMS of its finite elements, and how many of them lie
// within `atol` of zero. Summed in double, in order: a billion float32 squares lose ~1e-7 of the
// sum, far below anything the rule's factor of 10 could notice.
struct host_scale {
  std::uint64_t finite = 0, under = 0;
  double rms = 0;
};
// One dtype's element as a double (element_value is this too): the loops below are written once
// and made for each dtype, so that the dtype is decided once a tensor, not once an element (on the
// 2-core machine the per-element switch left the comparison of a CPU verdict's outputs at several
// times a pass over their bytes: tools/bench/bench_compare.cpp).
template <class Stored, class Convert>
struct element_of {
  static double at(const std::byte* p, size_t i) noexcept {
    Stored v;
    std::memcpy(&v, p + i * sizeof(Stored), sizeof(Stored));
    return static_cast<double>(Convert{}(v));
  }
};
struct as_is {
  template <class T>
  T operator()(T v) const noexcept { return v; }
};
struct from_half {
  float operator()(std::uint16_t v) const noexcept { return half_to_float(v); }
};
struct from_bfloat16 {
  float operator()(std::uint16_t v) const noexcept { return bfloat16_to_float(v); }
};

// Calls f with the element_of type of `t` (a value of it, for its type).
template <class F>
decltype(auto) with_element(dtype t, F&& f) {
  switch (t) {
    case dtype::f64: return f(element_of<double, as_is>{});
    case dtype::f32: return f(element_of<float, as_is>{});
    case dtype::f16: return f(element_of<std::uint16_t, from_half>{});
    case dtype::bf16: return f(element_of<std::uint16_t, from_bfloat16>{});
    case dtype::i64: return f(element_of<std::int64_t, as_is>{});
    case dtype::i32: return f(element_of<std::int32_t, as_is>{});
    case dtype::i16: return f(element_of<std::int16_t, as_is>{});
    case dtype::i8: return f(element_of<std::int8_t, as_is>{});
    case dtype::u8:
    case dtype::boolean: break;
  }
  return f(element_of<std::uint8_t, as_is>{});
}

} // namespace

double element_value(const std::byte* p, dtype t) noexcept {
  return with_element(t, [&](auto e) { return decltype(e)::at(p, 0); });
}

namespace {

template <class E>
host_scale measure_host_as(const std::byte* p, size_t n, double atol) {
  host_scale s;
  double sumsq = 0;
  for (size_t i = 0; i < n; ++i) {
    const double w = E::at(p, i);
    if (!std::isfinite(w))
      continue;
    sumsq += w * w;
    ++s.finite;
    s.under += std::fabs(w) <= atol;
  }
  s.rms = s.finite != 0 ? std::sqrt(sumsq / static_cast<double>(s.finite)) : 0.0;
  return s;
}

host_scale measure_host(const std::byte* p, size_t n, dtype t, double atol) {
  return with_element(t, [&](auto e) { return measure_host_as<decltype(e)>(p, n, atol); });
}

// Element by element within `t`: how many differ, the largest finite difference, the first that
// differs (n where none does).
struct host_differences {
  std::uint64_t bad = 0;
  double worst = 0;
  size_t first_bad = 0;
};
template <class E>
host_differences differences_as(const std::byte* wp, const std::byte* gp, size_t n, tolerance t) {
  host_differences d;
  d.first_bad = n;
  for (size_t i = 0; i < n; ++i) {
    const double w = E::at(wp, i);
    const double g = E::at(gp, i);
    bool ok;
    if (std::isnan(w) || std::isnan(g)) {
      ok = std::isnan(w) && std::isnan(g);
    } else if (std::isinf(w) || std::isinf(g)) {
      ok = w == g;
    } else {
      const double diff = std::fabs(g - w);
      d.worst = std::max(d.worst, diff);
      ok = diff <= t.atol + t.rtol * std::fabs(w);
    }
    if (!ok) {
      if (d.first_bad == n)
        d.first_bad = i;
      ++d.bad;
    }
  }
  return d;
}

// "output 0: values ~0.000977 (RMS), the tolerance is judged relative to the outputs (atol
// 0.0001 -> 9.77e-07)"
std::string scale_words(double rms, double atol, double scaled_atol) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "values ~%.3g (RMS), the tolerance is judged relative to the outputs (atol %g -> %.3g)",
                rms, atol, scaled_atol);
  return buf;
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
  // The dtype's tolerance; atol follows the reference's scale (atol_for_scale, measured on
  // `want` only: nothing the candidate returns can move it) and then takes the reference's
  // rounding slack, as before the rule.
  const auto configured = tol.for_dtype(want.type);
  const double slack = configured.atol > 0 || configured.rtol > 0 ? want.slack : 0.0;
  auto t = configured;
  std::string scale_text; // set where the rule lowered atol
  auto follow_scale = [&](double rms) {
    t.atol = atol_for_scale(configured.atol, configured.rtol, rms);
    if (t.atol < configured.atol) {
      scale_text = scale_words(rms, configured.atol, t.atol);
      res.scale_note += (res.scale_note.empty() ? "" : "; ") + name + ": " + scale_text;
    }
    t.atol += slack;
  };
  auto report = [&](std::uint64_t bad, double worst, std::uint64_t first_bad, double g, double w) {
    res.max_abs_diff = std::max(res.max_abs_diff, worst);
    res.mismatches += bad;
    if (bad > 0) {
      char buf[512];
      char widened[96] = "";
      if (t.atol > 0 && slack > 0)
        std::snprintf(widened, sizeof widened, " (%g of it for the reference's own rounding error)", slack);
      std::snprintf(buf, sizeof buf,
                    "%llu of %zu elements outside atol=%g%s rtol=%g%s%s (max abs diff %.3g; first at flat index %llu: got %.6g, expected %.6g)",
                    static_cast<unsigned long long>(bad), n, t.atol, widened, t.rtol, scale_text.empty() ? "" : ": ",
                    scale_text.c_str(), worst, static_cast<unsigned long long>(first_bad), g, w);
      fail(buf);
    }
  };
  if (want.device && got.device) {
    // Both on the device: the evaluator's own kernel compares them where they are, and measures
    // the reference's scale there (device_difference::rms) for the same rule.
    auto report_device = [&](const device_difference& d) {
      follow_scale(d.rms);
      report(d.mismatches, d.max_abs_diff, d.first_bad, element_value(d.got_first, want.type),
             element_value(d.want_first, want.type));
    };
    if (ahead != nullptr) {
      if (auto it = ahead->find({want.device.get(), got.device.get()}); it != ahead->end())
        return report_device(it->second);
    }
    auto d = device_compare(*want.device, *got.device, want.type, n, configured, slack);
    if (!d) {
      res.evaluator_error = res.ok; // only when it is the first problem found
      return fail("cannot compare on the device: " + d.error().message);
    }
    return report_device(*d);
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
  // The scale first (a pass over the reference alone), where the rule can change atol.
  follow_scale(is_floating(want.type) && configured.atol > 0 && configured.rtol > 0
                   ? measure_host(wp, n, want.type, configured.atol).rms
                   : 0.0);
  const auto d = with_element(want.type, [&](auto e) { return differences_as<decltype(e)>(wp, gp, n, t); });
  if (d.bad > 0)
    report(d.bad, d.worst, d.first_bad, element_value(gp + d.first_bad * es, want.type),
           element_value(wp + d.first_bad * es, want.type));
  else
    report(0, d.worst, 0, 0, 0);
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
      const auto t = tol.for_dtype(w.type);
      pairs.push_back({w.device.get(), g.device.get(), w.type, n, t, t.atol > 0 || t.rtol > 0 ? w.slack : 0.0});
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

result<output_scale> measure_output_scale(const tensor_blob& want, const tolerances& tol) {
  output_scale s;
  s.configured = tol.for_dtype(want.type);
  s.atol = s.configured.atol;
  if (!want.kind.empty() || !is_floating(want.type))
    return s;
  const auto n = static_cast<std::uint64_t>(want.numel());
  const auto es = element_size(want.type);
  std::uint64_t under = 0;
  if (want.device) {
    if (want.device->size() != n * es)
      return s; // the comparison names the problem
    auto d = device_scale(*want.device, want.type, n, s.configured.atol);
    if (!d)
      return d.error();
    s.finite = d->finite;
    s.rms = d->rms;
    under = d->under_atol;
  } else {
    if (want.bytes.size() != n * es)
      return s;
    const auto h = measure_host(want.bytes.data(), static_cast<size_t>(n), want.type, s.configured.atol);
    s.finite = h.finite;
    s.rms = h.rms;
    under = h.under;
  }
  s.floating = true;
  s.share_under_atol = s.finite != 0 ? static_cast<double>(under) / static_cast<double>(s.finite) : 0.0;
  s.atol = atol_for_scale(s.configured.atol, s.configured.rtol, s.rms);
  s.scaled = s.atol < s.configured.atol;
  return s;
}

std::string describe_output_scale(std::size_t index, const output_scale& s) {
  char buf[240];
  std::snprintf(buf, sizeof buf,
                "output %zu: values ~%.3g (RMS), %.3g%% of them within atol %g of zero; the tolerance is judged "
                "relative to the outputs (atol %g -> %.3g)",
                index, s.rms, 100 * s.share_under_atol, s.configured.atol, s.configured.atol, s.atol);
  return buf;
}

std::string within_tolerance_line(const std::vector<tensor_blob>& reference, const tolerances& tol) {
  std::string parts;
  for (size_t i = 0; i < reference.size(); ++i) {
    auto s = measure_output_scale(reference[i], tol);
    if (s && s->scaled)
      parts += (parts.empty() ? "" : "; ") + describe_output_scale(i, *s);
  }
  return parts.empty() ? parts : std::string{within_tolerance_phrase} + parts;
}

std::string within_tolerance_of(std::string_view message) {
  auto at = message.find(within_tolerance_phrase);
  if (at == std::string_view::npos)
    return {};
  at += within_tolerance_phrase.size();
  return std::string{message.substr(at, message.find('\n', at) - at)};
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
