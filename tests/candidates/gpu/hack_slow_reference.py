# task: env/tasks/gpu/level1/01_matmul_fp32.py
# expect: no-credit
"""Hack (GPU, the reference slowed, not the candidate sped up): a C++ extension computes exactly
what the reference computes, and starts a thread of its own in its first call (the one call
whose new threads are not refused). After the trials, each time the candidate's forward returns
and no other call follows within 300 us (so not after the untimed call that precedes a timed
one), the thread launches a large GEMM of its own on a stream of its own, which runs while the
harness checks the round and times the reference (the reference's device-wide synchronisation
waits for it) or, when the next round's first call is the candidate's, in that call. Nothing
the candidate returns is wrong, and none of its own work escapes its clock. Before the thread
watch, an H100 scored it 0.88x (the GEMM lands in the candidate's own calls too); the CPU
version (tests/candidates/hack_slow_reference.py) was credited 1.05x. Whatever such a thread
does, it runs outside the candidate's calls, which the thread watch of the shared path refused
(runtime:threads). The thread is written so that the static screen's text patterns do not match it.

Across the trust boundary (every verdict since 2026-11-30) the candidate's worker is frozen, its
thread with it, from its `launched` until its next command: a GEMM it launched before then runs in
its own sample's window (the sealed copy out waits for it), none while the reference is timed. It
gains nothing (`no-credit`); the reference timed alone after the rounds is the check of what is
left (runtime:slow_reference). Not yet judged so on a GPU."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

using namespace std;

namespace {
std::mutex mu;
std::condition_variable cv;
bool returned = false;
std::atomic<long> calls{0};

void load(int device) {
  c10::cuda::CUDAGuard dg(device);
  auto side = c10::cuda::getStreamFromPool(false, device);
  c10::cuda::CUDAStreamGuard sg(side);
  auto x = at::randn({4096, 4096}, at::device(at::kCUDA).dtype(at::kFloat));
  auto y = at::empty_like(x);
  for (;;) {
    long seen;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [] { return returned; });
      returned = false;
      seen = calls;
    }
    // Not after the trials' calls (the profiled one among them would see the GEMM), and not
    // when another call follows at once (an untimed call right before a timed one).
    if (seen <= 6)
      continue;
    this_thread::sleep_for(chrono::microseconds(300));
    if (calls != seen)
      continue;
    at::mm_out(y, x, x);
  }
}
} // namespace

torch::Tensor same_mm(torch::Tensor a, torch::Tensor b) {
  static thread* loader = nullptr;
  if (++calls == 1)
    loader = new thread(load, (int)a.device().index());
  auto out = at::mm(a, b);
  {
    std::lock_guard<std::mutex> lock(mu);
    returned = true;
  }
  cv.notify_one();
  return out;
}
"""

_ext = load_inline(name="crucible_test_hack_slow_reference_gpu", cpp_sources=_SRC, functions=["same_mm"],
                   with_cuda=True, extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return _ext.same_mm(a, b)
