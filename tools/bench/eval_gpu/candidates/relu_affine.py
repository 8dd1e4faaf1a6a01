"""A CUDA kernel through load_inline: relu(a * x + b) in one pass, vectorised by float4."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_cuda = r"""
#include <torch/extension.h>

__global__ void relu_affine_kernel(const float4* x, const float4* a, const float4* b, float4* y, long n4) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  long stride = (long)gridDim.x * blockDim.x;
  for (; i < n4; i += stride) {
    float4 xv = x[i], av = a[i], bv = b[i], r;
    r.x = fmaxf(av.x * xv.x + bv.x, 0.f);
    r.y = fmaxf(av.y * xv.y + bv.y, 0.f);
    r.z = fmaxf(av.z * xv.z + bv.z, 0.f);
    r.w = fmaxf(av.w * xv.w + bv.w, 0.f);
    y[i] = r;
  }
}

torch::Tensor relu_affine(torch::Tensor x, torch::Tensor a, torch::Tensor b) {
  auto y = torch::empty_like(x);
  long n4 = x.numel() / 4;
  int threads = 256;
  int blocks = (int)std::min<long>((n4 + threads - 1) / threads, 132L * 32);
  relu_affine_kernel<<<blocks, threads>>>(reinterpret_cast<const float4*>(x.data_ptr<float>()),
                                          reinterpret_cast<const float4*>(a.data_ptr<float>()),
                                          reinterpret_cast<const float4*>(b.data_ptr<float>()),
                                          reinterpret_cast<float4*>(y.data_ptr<float>()), n4);
  return y;
}
"""

_cpp = "torch::Tensor relu_affine(torch::Tensor x, torch::Tensor a, torch::Tensor b);"

_ext = load_inline(name="crucible_bench_relu_affine", cpp_sources=_cpp, cuda_sources=_cuda,
                   functions=["relu_affine"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, a, b):
        return _ext.relu_affine(x.contiguous(), a.contiguous(), b.contiguous())
