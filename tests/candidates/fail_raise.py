# task: env/tasks/cpu/01_relu_scale.py
# expect: runtime_error
"""Failure mode: forward raises an exception."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        raise RuntimeError("fail_raise: this candidate always fails in forward")
