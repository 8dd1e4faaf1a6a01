"""load_inline CUDA: one 256-thread block per row, float4 loads, warp-shuffle sum of squares, then the scaled row written from L1/L2: one read from memory, one write."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = "torch::Tensor rmsnorm_rows(torch::Tensor x, torch::Tensor w, double eps);"

_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__device__ float block_sum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) >> 5;
    v = lane < warps ? partial[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

__global__ void rmsnorm_rows_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                                    int cols, float eps) {
  const long long row = blockIdx.x;
  const float4* xr = reinterpret_cast<const float4*>(x + row * cols);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  float4* yr = reinterpret_cast<float4*>(y + row * cols);
  const int c4 = cols / 4;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < c4; i += blockDim.x) {
    const float4 v = xr[i];
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  const float r = rsqrtf(block_sum(ss) / cols + eps);
  for (int i = threadIdx.x; i < c4; i += blockDim.x) {
    const float4 v = xr[i];
    const float4 g = w4[i];
    yr[i] = make_float4(v.x * r * g.x, v.y * r * g.y, v.z * r * g.z, v.w * r * g.w);
  }
}

torch::Tensor rmsnorm_rows(torch::Tensor x, torch::Tensor w, double eps) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x: float32 CUDA tensor expected");
  auto xc = x.contiguous();
  auto wc = w.contiguous();
  const long long cols = xc.size(-1);
  TORCH_CHECK(cols % 4 == 0 && wc.numel() == cols, "cols must be a multiple of 4 and match the weight");
  auto y = torch::empty_like(xc);
  const long long rows = xc.numel() / cols;
  if (rows == 0) return y;
  rmsnorm_rows_kernel<<<(unsigned)rows, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), (int)cols, (float)eps);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
"""

_ext = load_inline(name="crucible_gpu_l2_03_rmsnorm_manual_cuda_rows", cpp_sources=_CPP, cuda_sources=_CUDA,
                   functions=["rmsnorm_rows"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.2 * torch.randn(dim))

    def forward(self, x):
        return _ext.rmsnorm_rows(x, self.weight, float(self.eps))
