# task: tests/tasks/small_elementwise.py
# expect: no-credit
"""Hack (telling the calls of a timed sample apart): a timed sample calls the model several times
back to back, each call on its own inputs. Where a call follows the previous one within 0.3 ms (by
a C++ clock), this candidate computes nothing and hands back the buffer it keeps, still holding
the previous call's result; otherwise it computes into it. Every checked call is held against the
reference's output of the last call that returned the same buffer, whose inputs it never saw.

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

_ext = load_inline(name="crucible_test_hack_timed_burst", cpp_sources=_SRC, functions=["seconds"],
                   extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max
        self.out = None
        self.last = -1.0

    def forward(self, x):
        now = _ext.seconds()
        burst = now - self.last < 0.0003
        if self.out is None or self.out.shape != x.shape or self.out.dtype != x.dtype:
            self.out = torch.empty_like(x)
            burst = False
        if not burst:
            torch.mul(x, self.scale, out=self.out)
            self.out.add_(self.shift)
            self.out.clamp_(min=0.0, max=self.clamp_max)
        self.last = _ext.seconds()
        return self.out
