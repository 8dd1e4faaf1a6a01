// tools/bench/bench_timers.hpp: bench_decode's own instruments, out of the policy library that no
// product path uses: the device's copy bandwidth (the bound a decoding step is measured against)
// and the persistent decoding kernel's stage timeline (policy/kernels/decode_layers.cu, off by
// default). Compiled into bench_decode with torch's flags (crucible_use_torch).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace crucible::bench {

/// Copy bandwidth of `device`: the best of `repeats` copies of a `bytes`-byte buffer to another
/// buffer on the same device, in bytes moved (read plus written, 2 x bytes) per second. CUDA
/// copies are timed with events on the current stream; CPU copies (one thread) with a steady
/// clock. Allocates 2 x bytes on the device for the duration. errc::invalid_arg for a bad
/// device name or size, errc::device when CUDA fails (out of memory included).
result<double> copy_bandwidth(std::string_view device, std::uint64_t bytes, int repeats = 5);

/// One stage of the persistent decoding kernel's layers, timed by its blocks (medians over the
/// layers after the first): `span_us` from the end of the stage before (its last block) to the
/// end of this one (its last block); `first_start_us` from that same end to the first block of
/// this stage starting (how long the counter took to be seen; attention counts only the blocks
/// with an attention item); `slowest_us` the longest any block spent in the stage.
struct layer_stage_time {
  std::string stage;
  double span_us = 0, first_start_us = 0, slowest_us = 0;
};

/// Runs `fn`, which decodes at one row on the current CUDA device, with every launch of the
/// persistent decoding kernel recording its timeline (kernels::set_decode_layers_timeline), and
/// summarises the last launch's. Errors without CUDA or when no launch ran.
result<std::vector<layer_stage_time>> time_decode_layers(const std::function<void()>& fn, std::int64_t layers);

} // namespace crucible::bench
