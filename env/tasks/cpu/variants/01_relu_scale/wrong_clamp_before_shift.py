"""WRONG: clamps x*scale to clamp_max before adding shift, so values above clamp_max - shift come out too large."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        y = torch.mul(x, self.scale).clamp_(max=self.clamp_max)
        return y.add_(self.shift).relu_()
