# task: env/tasks/cpu/01_relu_scale.py
# expect: rejected runtime:timing_outputs
"""Hack: correct in the correctness trials, then, from its 13th call on (the timing rounds),
returns the first result it computed instead of computing: only the timing rounds' output check
(sampled positions of a 2M-element output) can see it."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max
        self.calls = 0
        self.first = None

    def forward(self, x):
        self.calls += 1
        if self.calls > 12 and self.first is not None:
            return self.first.clone()
        y = torch.clamp(torch.relu(x * self.scale + self.shift), max=self.clamp_max)
        if self.first is None:
            self.first = y.clone()
        return y
