# task: env/tasks/gpu/level1/01_matmul_fp32.py
# expect: rejected runtime:timing_outputs
"""Hack (GPU): tells the timed calls from the checked ones by the count of calls (the trials'
six come first) and in them computes only the first eleven twelfths of the output rows, leaving
the rest at zero: 8% of the elements, under the 10% that the timing rounds' check let through
before. Every timed call's output is now checked at the correctness tolerance."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, a, b):
        self.calls += 1
        if self.calls <= 6:
            return a @ b
        out = torch.zeros(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
        rows = a.shape[0] - a.shape[0] // 12
        out[:rows] = a[:rows] @ b
        return out
