# task: env/tasks/cpu/10_matmul_rowsum.py
# expect: rejected runtime:timing_outputs
"""Hack (work the clock does not see, on a thread): a C++ extension starts a thread of its own
in its first call (the one call whose new threads are not refused, where runtimes start theirs)
and, after the trials' six calls, returns an output it has not written yet and leaves the work
to that thread, which finishes it after the clock stopped. The thread is written so that the
static screen's text patterns do not match it (no "std::thread", no detach). Where one worker
timed both sides (the shared path, removed on 2026-11-30) each timed call's outputs were
snapshotted as the clock stopped, before the thread was done. Across the trust boundary the worker
is stopped when it says `sampled`, and its outputs are read then: the thread's work is unfinished. The thread computes what the
reference does, which takes milliseconds: an earlier version computed the matrix-vector product
(fast_matvec's algebra) and on CI's loaded machine sometimes finished before the stop, inside the
clock, and was credited 7.3x for the algebra and a second core (fast_matvec alone: 5.3-5.8x);
hack_extra_cores.py is that second core, which each sample's CPU time now pays for."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
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

void rowsum_into(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& out) {
  at::sum_out(out, at::mm(a, b), {-1});
}

void serve() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [] { return pending; });
    rowsum_into(pa, pb, pout);
    pending = false;
  }
}
} // namespace

torch::Tensor rowsum(torch::Tensor a, torch::Tensor b) {
  static thread* server = nullptr;
  if (++calls == 1)
    server = new thread(serve);
  auto out = torch::empty({a.size(0)}, a.options());
  if (calls <= 6) {
    rowsum_into(a, b, out);
    return out;
  }
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

_ext = load_inline(name="crucible_test_hack_timed_async_thread", cpp_sources=_SRC, functions=["rowsum"],
                   extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return _ext.rowsum(A, B)
