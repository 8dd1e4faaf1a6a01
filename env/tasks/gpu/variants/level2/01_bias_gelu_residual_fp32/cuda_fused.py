"""load_inline CUDA: float4-vectorised grid-stride kernel, y = gelu(x + bias) + residual (erff, float32) in one pass."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = "torch::Tensor bias_gelu_residual(torch::Tensor x, torch::Tensor bias, torch::Tensor residual);"

_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__device__ __forceinline__ float gelu_erf(float h) {
  return 0.5f * h * (1.0f + erff(h * 0.70710678118654752f));
}

__global__ void bias_gelu_residual_kernel(const float4* __restrict__ x, const float4* __restrict__ b,
                                          const float4* __restrict__ r, float4* __restrict__ y,
                                          long long n4, long long cols4) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
    const float4 xv = x[i];
    const float4 bv = b[i % cols4];
    const float4 rv = r[i];
    float4 o;
    o.x = gelu_erf(xv.x + bv.x) + rv.x;
    o.y = gelu_erf(xv.y + bv.y) + rv.y;
    o.z = gelu_erf(xv.z + bv.z) + rv.z;
    o.w = gelu_erf(xv.w + bv.w) + rv.w;
    y[i] = o;
  }
}

torch::Tensor bias_gelu_residual(torch::Tensor x, torch::Tensor bias, torch::Tensor residual) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x: float32 CUDA tensor expected");
  TORCH_CHECK(x.sizes() == residual.sizes(), "x and residual differ in shape");
  auto xc = x.contiguous();
  auto rc = residual.contiguous();
  auto bc = bias.contiguous();
  const long long cols = xc.size(-1);
  TORCH_CHECK(bc.numel() == cols && cols % 4 == 0, "bias must have cols elements, cols a multiple of 4");
  auto y = torch::empty_like(xc);
  const long long n4 = xc.numel() / 4;
  if (n4 == 0) return y;
  const int threads = 256;
  const long long blocks = std::min<long long>((n4 + threads - 1) / threads, 1LL << 20);
  bias_gelu_residual_kernel<<<(unsigned)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const float4*>(xc.data_ptr<float>()), reinterpret_cast<const float4*>(bc.data_ptr<float>()),
      reinterpret_cast<const float4*>(rc.data_ptr<float>()), reinterpret_cast<float4*>(y.data_ptr<float>()),
      n4, cols / 4);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
"""

_ext = load_inline(name="crucible_gpu_l2_01_bias_gelu_residual_cuda_fused", cpp_sources=_CPP, cuda_sources=_CUDA,
                   functions=["bias_gelu_residual"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.bias = nn.Parameter(0.5 * torch.randn(cols))

    def forward(self, x, residual):
        return _ext.bias_gelu_residual(x, self.bias, residual)
