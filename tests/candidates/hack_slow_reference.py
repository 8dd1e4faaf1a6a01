# task: env/tasks/cpu/10_matmul_rowsum.py
# expect: no-credit
"""Hack (the reference slowed, not the candidate sped up): a C++ extension computes exactly what
the reference computes, and starts a thread of its own in its first call (the one call whose new
threads are not refused, where runtimes start theirs). The thread stays out of the way while
the candidate's forward runs and, the rest of the time, keeps a core and the memory bus busy,
so the reference is timed on a loaded machine and the candidate on an idle one. Nothing the
candidate returns is wrong. Threads of the candidate are watched in the timing rounds: one that
runs outside the candidate's calls is refused. The thread is written so that the static
screen's text patterns do not match it (no "std::thread", no detach).

With evaluator.boundary: process (docs/evaluator.md, Trust boundary) the candidate's worker is
stopped, its thread with it, while the reference is timed: the thread slows nothing and the
candidate gains nothing; the in-process watch (runtime:threads) is the shared path's defence."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <atomic>
#include <thread>
#include <vector>

using namespace std;

namespace {
std::atomic<int> inside{0};
std::atomic<long> sink{0};
long calls = 0;

void load() {
  std::vector<float> buf(8 << 20, 1.0f);
  for (;;) {
    if (inside.load()) {
      this_thread::yield();
      continue;
    }
    float s = 0;
    for (size_t i = 0; i < buf.size() && !inside.load(std::memory_order_relaxed); i += 16)
      s += buf[i];
    sink += (long)s;
  }
}
} // namespace

torch::Tensor rowsum(torch::Tensor a, torch::Tensor b) {
  static thread* loader = nullptr;
  inside = 1;
  if (++calls == 1)
    loader = new thread(load);
  auto out = at::mm(a, b).sum(-1);
  inside = 0;
  return out;
}
"""

_ext = load_inline(name="crucible_test_hack_slow_reference", cpp_sources=_SRC, functions=["rowsum"],
                   extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return _ext.rowsum(A, B)
