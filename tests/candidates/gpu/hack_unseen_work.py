# task: env/tasks/gpu/level1/01_matmul_fp32.py
# expect: rejected runtime:unseen_work
"""Hack (GPU, work the clock does not see, in every call): as hack_timed_async_thread, but from
its second call on, so also in the trials: each call returns an output it has not written, and
a thread of its own launches the GEMM into it on its own stream a moment after the call
returned, once the harness's device-wide synchronisation has begun. The profiler's device time
over all streams, taken on trial 0's second call, holds the GEMM; the clock's window for that
call does not, and the cross-check names it (or, where the late GEMM loses the race with the
trials' output copies, the trials find the output wrong)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

using namespace std;

namespace {
std::mutex mu;
std::condition_variable cv;
torch::Tensor pa, pb, pout;
bool pending = false;
long calls = 0;

void serve(int device) {
  c10::cuda::CUDAGuard dg(device);
  auto side = c10::cuda::getStreamFromPool(false, device);
  for (;;) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [] { return pending; });
    this_thread::sleep_for(chrono::microseconds(30));
    c10::cuda::CUDAStreamGuard sg(side);
    at::mm_out(pout, pa, pb);
    pending = false;
  }
}
} // namespace

torch::Tensor late_mm(torch::Tensor a, torch::Tensor b) {
  static thread* server = nullptr;
  if (++calls == 1)
    server = new thread(serve, (int)a.device().index());
  if (calls <= 1)
    return at::mm(a, b);
  auto out = at::empty({a.size(0), b.size(1)}, a.options());
  {
    std::lock_guard<std::mutex> lock(mu);
    pa = a;
    pb = b;
    pout = out;
    pending = true;
  }
  cv.notify_one();
  return out;
}
"""

_ext = load_inline(name="crucible_test_hack_unseen_work_gpu", cpp_sources=_SRC, functions=["late_mm"],
                   with_cuda=True, extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return _ext.late_mm(a, b)
