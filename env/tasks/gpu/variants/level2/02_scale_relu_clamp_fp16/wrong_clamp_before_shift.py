"""WRONG: clamps before adding the shift, so the upper bound becomes clamp_max + shift."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=1.5, shift=0.25, clamp_max=2.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        y = torch.clamp(x * self.scale, max=self.clamp_max)
        return torch.relu(y + self.shift)
