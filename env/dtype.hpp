// env/dtype.hpp: the element types an output may have, as the worker names them. Plain C++17 so
// that CUDA sources (env/eval/device/device_bytes.cu) can include it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace crucible::env {

enum class dtype : std::uint8_t { f64, f32, f16, bf16, i64, i32, i16, i8, u8, boolean };

/// Bytes per element.
constexpr std::size_t element_size(dtype t) noexcept {
  switch (t) {
    case dtype::f64: case dtype::i64: return 8;
    case dtype::f32: case dtype::i32: return 4;
    case dtype::f16: case dtype::bf16: case dtype::i16: return 2;
    case dtype::i8: case dtype::u8: case dtype::boolean: return 1;
  }
  return 1;
}

/// Absolute and relative tolerance: |got - want| <= atol + rtol * |want|.
struct tolerance {
  double atol = 1e-4;
  double rtol = 1e-4;
};

} // namespace crucible::env
