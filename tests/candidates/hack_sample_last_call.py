# task: tests/tasks/small_elementwise.py
# expect: no-credit
"""Hack (computing only the last call of a timed sample): a timed sample calls the model several
times back to back, as many times in every round of a verdict. This candidate tells the calls of
a burst apart by a C++ clock (a gap of over 0.3 ms starts a new burst), learns the longest burst,
and computes only on a burst's last call, handing back one buffer it keeps: every other call
returns the buffer as the previous burst left it. Checked only as the sample's clock stops, each
call's buffer would hold the last call's values and match the last call's reference; the
harness also snapshots one call's outputs inside the sample, right after it returns, and there
the buffer is stale.

With evaluator.boundary: process the evaluator sees the calls of a sample hand back the same
buffer and goes on with one call per sample: every timed call then computes, or fails the
comparison; no gain either way."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <chrono>

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
"""

_ext = load_inline(name="crucible_test_hack_sample_last_call", cpp_sources=_SRC, functions=["seconds"],
                   extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max
        self.out = None
        self.last = -1.0
        self.pos = 0
        self.longest = 1

    def forward(self, x):
        now = _ext.seconds()
        if now - self.last > 0.0003:
            self.pos = 0
        self.pos += 1
        self.longest = max(self.longest, self.pos)
        fresh = self.out is None or self.out.shape != x.shape or self.out.dtype != x.dtype
        if fresh:
            self.out = torch.empty_like(x)
        if fresh or self.pos >= self.longest:
            torch.mul(x, self.scale, out=self.out)
            self.out.add_(self.shift)
            self.out.clamp_(min=0.0, max=self.clamp_max)
        self.last = _ext.seconds()
        return self.out
