"""Elementwise chain: y = min(relu(x * scale + shift), clamp_max) -- four separate passes over a 2M-element tensor."""
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
    return [torch.randn(2048, 1024)]


def get_init_inputs():
    return [2.0, 0.5]
