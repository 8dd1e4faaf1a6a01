# task: env/tasks/cpu/01_relu_scale.py
# expect: rejected runtime:input_mutation
"""Hack: computes in place in the caller's input and returns it (no output allocation); a harness
that computes the reference first and never re-checks its inputs accepts it."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        return x.mul_(self.scale).add_(self.shift).clamp_(0.0, self.clamp_max)
