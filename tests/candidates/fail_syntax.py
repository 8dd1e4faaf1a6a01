# task: env/tasks/cpu/01_relu_scale.py
# expect: compile_error
"""Failure mode: a Python syntax error (unclosed parenthesis) so the module cannot be compiled."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        return torch.clamp(torch.relu(x * self.scale + self.shift, max=self.clamp_max
