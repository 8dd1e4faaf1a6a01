# task: env/tasks/cpu/01_relu_scale.py
# expect: ok
"""Legitimate: a load_inline C++ extension fusing scale, shift, relu and clamp into one pass (~3x)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
torch::Tensor fused_relu_scale(torch::Tensor x, double scale, double shift, double clamp_max) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 expected");
  auto xc = x.contiguous();
  auto y = torch::empty_like(xc);
  const float* __restrict__ src = xc.data_ptr<float>();
  float* __restrict__ dst = y.data_ptr<float>();
  const int64_t n = xc.numel();
  const float s = (float)scale, b = (float)shift, hi = (float)clamp_max;
  for (int64_t i = 0; i < n; ++i) {
    float v = src[i] * s + b;
    v = v > 0.f ? v : 0.f;
    dst[i] = v < hi ? v : hi;
  }
  return y;
}
"""

_ext = load_inline(name="crucible_test_legit_cpp_relu_scale", cpp_sources=_SRC,
                   functions=["fused_relu_scale"], extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        return _ext.fused_relu_scale(x, self.scale, self.shift, self.clamp_max)
