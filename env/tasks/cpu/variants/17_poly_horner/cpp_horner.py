"""load_inline C++: Horner's rule fused into one vectorised pass over x; measured ~22x on one core."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
torch::Tensor poly5(torch::Tensor x, double c0, double c1, double c2, double c3, double c4, double c5) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 expected");
  auto xc = x.contiguous();
  auto y = torch::empty_like(xc);
  const float* __restrict__ px = xc.data_ptr<float>();
  float* __restrict__ py = y.data_ptr<float>();
  const int64_t n = xc.numel();
  const float k0 = c0, k1 = c1, k2 = c2, k3 = c3, k4 = c4, k5 = c5;
  for (int64_t i = 0; i < n; ++i) {
    const float v = px[i];
    py[i] = ((((k5 * v + k4) * v + k3) * v + k2) * v + k1) * v + k0;
  }
  return y;
}
"""

_ext = load_inline(name="crucible_cpu17_poly_horner_cpp", cpp_sources=_SRC,
                   functions=["poly5"], extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, c0=0.5, c1=-1.0, c2=0.75, c3=0.25, c4=-0.125, c5=0.0625):
        super().__init__()
        self.coeffs = [c0, c1, c2, c3, c4, c5]

    def forward(self, x):
        return _ext.poly5(x, *self.coeffs)
