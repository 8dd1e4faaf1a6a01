# task: tests/tasks/small_elementwise.py
# expect: ok
"""Legitimate: every call writes its result into one output buffer the module keeps, and returns
that buffer (out= style, as many hand-written kernels do). The calls of a timed sample then all
return the same tensor, which holds the last call's values when the sample ends: the harness
checks it against the reference's output of that last call, not of the call that first returned
it (env/eval/harness/outputs.py, _checked_reference)."""
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
