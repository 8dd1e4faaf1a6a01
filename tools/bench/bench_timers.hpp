// tools/bench/bench_timers.hpp: bench_decode's own instrument, out of the policy library that no
// product path uses: the device's copy bandwidth (the bound a decoding step is measured against).
// Compiled into bench_decode with torch's flags (crucible_use_torch).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/error.hpp"

namespace crucible::bench {

/// Copy bandwidth of `device`: the best of `repeats` copies of a `bytes`-byte buffer to another
/// buffer on the same device, in bytes moved (read plus written, 2 x bytes) per second. CUDA
/// copies are timed with events on the current stream; CPU copies (one thread) with a steady
/// clock. Allocates 2 x bytes on the device for the duration. errc::invalid_arg for a bad
/// device name or size, errc::device when CUDA fails (out of memory included).
result<double> copy_bandwidth(std::string_view device, std::uint64_t bytes, int repeats = 5);

} // namespace crucible::bench
