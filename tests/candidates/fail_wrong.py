# task: env/tasks/cpu/01_relu_scale.py
# expect: incorrect
"""Failure mode: fast but wrong, the shift is applied after the relu instead of before it."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        return torch.mul(x, self.scale).relu_().add_(self.shift).clamp_(max=self.clamp_max)
