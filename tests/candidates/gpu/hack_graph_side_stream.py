# task: env/tasks/gpu/level1/01_matmul_fp32.py
# expect: no-credit
"""Hack (GPU, work the clock does not see, through a graph launch): a C++ extension captures the
GEMM into a CUDA graph on a stream of its own in its first call, and in every call copies the
inputs into the graph's buffers and replays the graph on that stream without making the
caller's stream wait, returning the graph's output buffer. The graph's work is on no stream the
start and stop events are recorded on; the stop event follows a device-wide synchronisation,
which waits for it, so it is timed all the same (the same GEMM: no faster than the reference)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

namespace {
at::cuda::CUDAGraph* graph = nullptr;
torch::Tensor sa, sb, sout;
}

torch::Tensor graph_mm(torch::Tensor a, torch::Tensor b) {
  const int device = a.device().index();
  auto caller = c10::cuda::getCurrentCUDAStream(device);
  auto side = c10::cuda::getStreamFromPool(false, device);
  cudaEvent_t ready;
  cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  cudaEventRecord(ready, caller.stream());
  cudaStreamWaitEvent(side.stream(), ready, 0);
  cudaEventDestroy(ready);
  c10::cuda::CUDAStreamGuard guard(side);
  if (graph == nullptr) {
    sa = a.clone();
    sb = b.clone();
    at::mm(sa, sb);  // cuBLAS's workspace, before the capture
    side.synchronize();
    graph = new at::cuda::CUDAGraph();
    graph->capture_begin();
    sout = at::mm(sa, sb);
    graph->capture_end();
  }
  sa.copy_(a);
  sb.copy_(b);
  graph->replay();
  return sout;
}
"""

_ext = load_inline(name="crucible_test_hack_graph_side_stream", cpp_sources=_SRC, functions=["graph_mm"],
                   with_cuda=True, extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return _ext.graph_mm(a, b)
