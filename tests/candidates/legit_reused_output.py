# task: tests/tasks/small_elementwise.py
# expect: ok
"""Legitimate: every call writes its result into one output buffer the module keeps, and returns
that buffer (out= style, as many hand-written kernels do). The calls of a timed sample then all
return the same memory, which holds the last call's values when the sample ends: the evaluator
sees two calls hand back the same memory, leaves that round uncounted and goes on with one call a
sample (env/eval/boundary.cpp, outputs_reused), so that every call it checks is one whose outputs
it reads."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max
        self.out = None

    def forward(self, x):
        if self.out is None or self.out.shape != x.shape or self.out.dtype != x.dtype:
            self.out = torch.empty_like(x)
        torch.mul(x, self.scale, out=self.out)
        self.out.add_(self.shift)
        self.out.clamp_(min=0.0, max=self.clamp_max)
        return self.out
