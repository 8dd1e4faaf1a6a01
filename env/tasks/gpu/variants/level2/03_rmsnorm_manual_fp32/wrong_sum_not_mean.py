"""WRONG: normalises by the root of the sum of squares instead of their mean."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.2 * torch.randn(dim))

    def forward(self, x):
        ss = x.pow(2).sum(dim=-1, keepdim=True)
        return x * torch.rsqrt(ss + self.eps) * self.weight
