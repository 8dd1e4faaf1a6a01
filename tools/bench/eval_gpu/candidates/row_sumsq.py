"""A CUDA kernel through load_inline: one block per row, squares summed in registers, no temporary."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_cuda = r"""
#include <torch/extension.h>

__global__ void row_sumsq_kernel(const float* x, float* out, int cols) {
  const float4* row = reinterpret_cast<const float4*>(x + (long)blockIdx.x * cols);
  float acc = 0.f;
  for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) {
    float4 v = row[i];
    acc += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  for (int off = 16; off > 0; off >>= 1)
    acc += __shfl_down_sync(0xffffffff, acc, off);
  __shared__ float warp_sums[32];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < blockDim.x / 32 ? warp_sums[lane] : 0.f;
    for (int off = 16; off > 0; off >>= 1)
      acc += __shfl_down_sync(0xffffffff, acc, off);
    if (lane == 0) out[blockIdx.x] = acc;
  }
}

torch::Tensor row_sumsq(torch::Tensor x) {
  auto out = torch::empty({x.size(0)}, x.options());
  row_sumsq_kernel<<<x.size(0), 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), (int)x.size(1));
  return out;
}
"""

_cpp = "torch::Tensor row_sumsq(torch::Tensor x);"

_ext = load_inline(name="crucible_bench_row_sumsq", cpp_sources=_cpp, cuda_sources=_cuda,
                   functions=["row_sumsq"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _ext.row_sumsq(x.contiguous())
