"""load_inline CUDA: one 256-thread block per row; h = x + residual rounded to bfloat16 (as the reference) kept in shared memory, two-pass mean/variance in float32, one bfloat16 write."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = "torch::Tensor add_layernorm(torch::Tensor x, torch::Tensor r, torch::Tensor w, torch::Tensor b, double eps);"

_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>

__device__ float block_sum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // partial[] may still be read by a previous call
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

__global__ void add_layernorm_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ r,
                                     const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ b,
                                     __nv_bfloat16* __restrict__ y, int cols, float eps) {
  extern __shared__ float h[];
  const long long base = (long long)blockIdx.x * cols;
  float s = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = __bfloat162float(__float2bfloat16(__bfloat162float(x[base + i]) + __bfloat162float(r[base + i])));
    h[i] = v;
    s += v;
  }
  const float mean = block_sum(s) / cols;
  float q = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    const float d = h[i] - mean;
    q += d * d;
  }
  const float rstd = rsqrtf(block_sum(q) / cols + eps);
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = (h[i] - mean) * rstd * __bfloat162float(w[i]) + __bfloat162float(b[i]);
    y[base + i] = __float2bfloat16(v);
  }
}

torch::Tensor add_layernorm(torch::Tensor x, torch::Tensor r, torch::Tensor w, torch::Tensor b, double eps) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16 && r.scalar_type() == torch::kBFloat16,
              "bfloat16 CUDA tensors expected");
  TORCH_CHECK(x.sizes() == r.sizes(), "x and residual differ in shape");
  auto xc = x.contiguous();
  auto rc = r.contiguous();
  auto wc = w.contiguous();
  auto bc = b.contiguous();
  const long long cols = xc.size(-1);
  TORCH_CHECK(wc.numel() == cols && bc.numel() == cols, "weight and bias must have cols elements");
  TORCH_CHECK(cols <= 8192, "rows longer than 8192 are not supported (shared memory)");
  auto y = torch::empty_like(xc);
  const long long rows = xc.numel() / cols;
  if (rows == 0) return y;
  add_layernorm_kernel<<<(unsigned)rows, 256, cols * sizeof(float), at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(xc.data_ptr<at::BFloat16>()),
      reinterpret_cast<const __nv_bfloat16*>(rc.data_ptr<at::BFloat16>()),
      reinterpret_cast<const __nv_bfloat16*>(wc.data_ptr<at::BFloat16>()),
      reinterpret_cast<const __nv_bfloat16*>(bc.data_ptr<at::BFloat16>()),
      reinterpret_cast<__nv_bfloat16*>(y.data_ptr<at::BFloat16>()), (int)cols, (float)eps);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
"""

_ext = load_inline(name="crucible_gpu_l2_15_add_layernorm_cuda_fused", cpp_sources=_CPP, cuda_sources=_CUDA,
                   functions=["add_layernorm"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter((1.0 + 0.2 * torch.randn(dim)).to(torch.bfloat16))
        self.bias = nn.Parameter((0.2 * torch.randn(dim)).to(torch.bfloat16))

    def forward(self, x, residual):
        return _ext.add_layernorm(x, residual, self.weight, self.bias, 1e-5)
