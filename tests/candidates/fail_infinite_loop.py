# task: env/tasks/cpu/01_relu_scale.py
# expect: timeout
"""Failure mode: forward never returns (busy loop)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        n = 0
        while True:
            n += 1
        return x
