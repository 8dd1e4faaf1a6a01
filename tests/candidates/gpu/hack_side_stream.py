# task: env/tasks/gpu/level1/01_matmul_fp32.py
# expect: no-credit
"""Hack (work the clock does not see): a C++ extension runs the GEMM on a non-blocking stream it
creates itself (no Python stream API to see), makes the output's memory that stream's, and
returns without waiting, so the GEMM may still run when the call's stop event is recorded. The
stop event follows a device-wide synchronisation, so the GEMM is timed all the same."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

static cudaStream_t side = nullptr;

torch::Tensor hidden_mm(torch::Tensor a, torch::Tensor b) {
  if (side == nullptr)
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  auto s = c10::cuda::getStreamFromExternal(side, a.device().index());
  // The inputs were written on the caller's stream: wait for them, then leave.
  cudaEvent_t ready;
  cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  cudaEventRecord(ready, c10::cuda::getCurrentCUDAStream(a.device().index()).stream());
  cudaStreamWaitEvent(side, ready, 0);
  cudaEventDestroy(ready);
  c10::cuda::CUDAStreamGuard guard(s);
  return at::matmul(a, b);
}
"""

_ext = load_inline(name="crucible_test_hack_side_stream", cpp_sources=_SRC, functions=["hidden_mm"],
                   with_cuda=True, extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return _ext.hidden_mm(a, b)
