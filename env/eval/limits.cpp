#include "env/eval/limits.hpp"

#include <algorithm>
#include <cmath>

#include "core/json.hpp"
#include "core/json_parse.hpp"

namespace crucible::env {

namespace {

bool rate(const json_value* x) {
  return x != nullptr && x->is_number() && std::isfinite(x->as_double()) && x->as_double() > 0;
}

} // namespace

std::optional<device_peaks> peaks_from_json(const json_value& p, std::string hardware) {
  if (!p.is_object())
    return std::nullopt;
  const auto* write = p.find("write_bytes_per_ms");
  const auto* copy = p.find("copy_bytes_per_ms");
  const auto* mm = p.find("matmul_flops_per_ms");
  if (!rate(write) || !rate(copy) || mm == nullptr || !mm->is_object() || mm->as_object().empty())
    return std::nullopt;
  device_peaks out;
  if (const auto* n = p.find("copy_bytes"); n != nullptr) {
    if (!rate(n))
      return std::nullopt;
    out.copy_bytes = n->as_double();
  }
  out.hardware = std::move(hardware);
  out.write_bytes_per_ms = write->as_double();
  out.copy_bytes_per_ms = copy->as_double();
  for (const auto& m : mm->as_object()) {
    if (!rate(&m.value) || m.key.empty() || m.key.size() >= 32)
      return std::nullopt;
    out.matmul_flops_per_ms[m.key] = m.value.as_double();
  }
  return out;
}

std::string to_json(const device_peaks& p) {
  json_writer w;
  w.begin_object()
    .field("hardware", p.hardware)
    .field("write_bytes_per_ms", p.write_bytes_per_ms)
    .field("copy_bytes_per_ms", p.copy_bytes_per_ms);
  if (p.copy_bytes > 0)
    w.field("copy_bytes", p.copy_bytes);
  if (p.copy_measured > 0) // raised by a reference's own call (raise_copy_rate): what was measured
    w.field("copy_measured_bytes_per_ms", p.copy_measured);
  w.key("matmul_flops_per_ms").begin_object();
  for (const auto& [dtype, r] : p.matmul_flops_per_ms)
    w.field(dtype, r);
  w.end_object().end_object();
  return std::move(w).take();
}

task_bound bound_of(const task_work& work, const device_peaks& peaks) {
  if (!work.counted() || !(peaks.copy_bytes_per_ms > 0) || peaks.matmul_flops_per_ms.empty())
    return {};
  const auto& mm = peaks.matmul_flops_per_ms;
  double fastest = 0;
  for (const auto& [_, r] : mm)
    fastest = std::max(fastest, r);
  task_bound b;
  b.bytes_ms = (work.bytes_read + work.bytes_written) / peaks.copy_bytes_per_ms;
  b.flops_ms = 0;
  for (const auto& [dtype, flops] : work.flops) {
    if (flops <= 0)
      continue;
    double r = 0;
    if (auto it = mm.find(dtype); it != mm.end())
      r = it->second;
    if (dtype == "float32")
      if (auto it = mm.find("tf32"); it != mm.end())
        r = std::max(r, it->second);
    b.flops_ms += flops / (r > 0 ? r : fastest);
  }
  b.ms = std::max(b.bytes_ms, b.flops_ms);
  return b;
}

double bound_floor_ms(const task_work& work, const device_peaks& peaks) {
  if (!work.counted() || !(peaks.copy_bytes > 0) || work.bytes_read + work.bytes_written < peaks.copy_bytes)
    return NAN;
  return 0.5 * bound_of(work, peaks).bytes_ms; // NaN where bound_of knows none
}

bool raise_copy_rate(device_peaks& peaks, const task_work& work, double ref_ms) {
  const double bytes = work.bytes_read + work.bytes_written;
  if (!work.counted() || !(ref_ms > 0) || !std::isfinite(ref_ms) || !(peaks.copy_bytes > 0) || bytes < peaks.copy_bytes)
    return false;
  const double rate = bytes / ref_ms;
  const double measured = peaks.copy_measured > 0 ? peaks.copy_measured : peaks.copy_bytes_per_ms;
  if (!(rate > peaks.copy_bytes_per_ms) || rate > raise_copy_limit * measured)
    return false;
  peaks.copy_measured = measured;
  peaks.copy_bytes_per_ms = rate;
  return true;
}

peaks_registry& peaks_registry::process() {
  static peaks_registry r;
  return r;
}

std::optional<device_peaks> peaks_registry::find(const std::string& hardware) const {
  std::lock_guard guard{mtx_};
  if (auto it = by_hardware_.find(hardware); it != by_hardware_.end())
    return it->second;
  return std::nullopt;
}

void peaks_registry::keep(device_peaks p) {
  std::lock_guard guard{mtx_};
  by_hardware_[p.hardware] = std::move(p);
}

double peaks_registry::observe(const std::string& hardware, const task_work& work, double ref_ms) {
  std::lock_guard guard{mtx_};
  auto it = by_hardware_.find(hardware);
  if (it == by_hardware_.end() || !raise_copy_rate(it->second, work, ref_ms))
    return NAN;
  return it->second.copy_bytes_per_ms;
}

} // namespace crucible::env
