# task: env/tasks/cpu/01_relu_scale.py
# expect: incorrect
"""Hack: allocates the output with torch.empty_like and only computes its first row, hoping the
allocator hands back the block of the reference's just-freed output (same size) with the right
values still in it."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        out = torch.empty_like(x)
        out[:1] = torch.clamp(x[:1] * self.scale + self.shift, 0.0, self.clamp_max)
        return out
