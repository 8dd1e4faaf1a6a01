"""WRONG: off-by-one mean of squares (divides the sum by N - 1 instead of N)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, eps=1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x, weight):
        ms = x.pow(2).sum(dim=-1, keepdim=True) / (x.shape[-1] - 1)
        return x * torch.rsqrt(ms + self.eps) * weight
