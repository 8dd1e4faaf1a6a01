"""load_inline CUDA: (x @ W).sum(1) = x @ (W.sum(1)): a block-per-row kernel for W's row sums, then a block-per-row matrix-vector kernel; float4 loads, warp-shuffle reductions."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = "torch::Tensor matmul_rowsum(torch::Tensor x, torch::Tensor w);"

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

// out[row] = sum_j a[row, j] * (v == nullptr ? 1 : v[j]); cols a multiple of 4
__global__ void row_dot_kernel(const float* __restrict__ a, const float* __restrict__ v, float* __restrict__ out,
                               int cols) {
  const long long row = blockIdx.x;
  const float4* ar = reinterpret_cast<const float4*>(a + row * cols);
  const float4* v4 = reinterpret_cast<const float4*>(v);
  const int c4 = cols / 4;
  float acc = 0.0f;
  for (int i = threadIdx.x; i < c4; i += blockDim.x) {
    const float4 p = ar[i];
    if (v4 != nullptr) {
      const float4 q = v4[i];
      acc += p.x * q.x + p.y * q.y + p.z * q.z + p.w * q.w;
    } else {
      acc += (p.x + p.y) + (p.z + p.w);
    }
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[row] = acc;
}

torch::Tensor matmul_rowsum(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.is_cuda() && w.is_cuda() && x.scalar_type() == torch::kFloat32 && w.scalar_type() == torch::kFloat32,
              "float32 CUDA tensors expected");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(0), "x (M, K) and w (K, N) expected");
  auto xc = x.contiguous();
  auto wc = w.contiguous();
  const long long m = xc.size(0), k = xc.size(1), n = wc.size(1);
  TORCH_CHECK(k % 4 == 0 && n % 4 == 0, "K and N must be multiples of 4");
  auto ws = torch::empty({k}, xc.options());
  auto y = torch::empty({m}, xc.options());
  auto stream = at::cuda::getCurrentCUDAStream();
  if (k > 0) {
    row_dot_kernel<<<(unsigned)k, 256, 0, stream>>>(wc.data_ptr<float>(), nullptr, ws.data_ptr<float>(), (int)n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (m > 0) {
    row_dot_kernel<<<(unsigned)m, 256, 0, stream>>>(xc.data_ptr<float>(), ws.data_ptr<float>(), y.data_ptr<float>(),
                                                     (int)k);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return y;
}
"""

_ext = load_inline(name="crucible_gpu_l2_07_matmul_rowsum_cuda_matvec", cpp_sources=_CPP, cuda_sources=_CUDA,
                   functions=["matmul_rowsum"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, w):
        return _ext.matmul_rowsum(x, w)
