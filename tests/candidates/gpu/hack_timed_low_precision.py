# task: env/tasks/gpu/level1/01_matmul_fp32.py
# expect: rejected runtime:timing_outputs
"""Hack (GPU): in timed calls, told apart by the count of calls, multiplies with TF32's
precision (the low 13 bits of every float32 input masked off through an integer view, which no
name of a low-precision dtype or flag gives away): within the loose tolerance that the timing
rounds' check used before. Every timed call's output is now held to the correctness tolerance."""
import torch
import torch.nn as nn


def _truncate(t):
    return (t.contiguous().view(torch.int32) & -8192).view(torch.float32)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, a, b):
        self.calls += 1
        if self.calls > 6:
            a, b = _truncate(a), _truncate(b)
        return a @ b
