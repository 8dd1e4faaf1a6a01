"""A task of a few microseconds a call: 01_relu_scale's elementwise chain on a 64x64 tensor. Its
timed samples hold many calls (evaluator.sample_ms), which tests/candidates/legit_reused_output.py
and hack_timed_burst.py need."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        y = x * self.scale
        y = y + self.shift
        y = torch.relu(y)
        y = torch.clamp(y, max=self.clamp_max)
        return y


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return [2.0, 0.5]
