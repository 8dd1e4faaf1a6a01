"""load_inline CUDA: diag(d) @ A as a float4 grid-stride row scaling y[i, j] = d[i] * A[i, j]: one read and one write of A."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = "torch::Tensor row_scale(torch::Tensor d, torch::Tensor a);"

_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__global__ void row_scale_kernel(const float* __restrict__ d, const float4* __restrict__ a, float4* __restrict__ y,
                                 long long n4, long long cols4) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
    const float s = d[i / cols4];
    const float4 v = a[i];
    y[i] = make_float4(s * v.x, s * v.y, s * v.z, s * v.w);
  }
}

torch::Tensor row_scale(torch::Tensor d, torch::Tensor a) {
  TORCH_CHECK(a.is_cuda() && d.is_cuda() && a.scalar_type() == torch::kFloat32 && d.scalar_type() == torch::kFloat32,
              "float32 CUDA tensors expected");
  TORCH_CHECK(a.dim() == 2 && d.dim() == 1 && d.size(0) == a.size(0), "d (N) and a (N, M) expected");
  auto ac = a.contiguous();
  auto dc = d.contiguous();
  const long long cols = ac.size(1);
  TORCH_CHECK(cols % 4 == 0, "the column count must be a multiple of 4");
  auto y = torch::empty_like(ac);
  const long long n4 = ac.numel() / 4;
  if (n4 == 0) return y;
  const int threads = 256;
  const long long blocks = std::min<long long>((n4 + threads - 1) / threads, 1LL << 20);
  row_scale_kernel<<<(unsigned)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
      dc.data_ptr<float>(), reinterpret_cast<const float4*>(ac.data_ptr<float>()),
      reinterpret_cast<float4*>(y.data_ptr<float>()), n4, cols / 4);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
"""

_ext = load_inline(name="crucible_gpu_l2_08_diag_matmul_cuda_rowscale", cpp_sources=_CPP, cuda_sources=_CUDA,
                   functions=["row_scale"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, d, a):
        return _ext.row_scale(d, a)
