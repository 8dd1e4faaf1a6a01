"""Fused sequence: RMSNorm written out (square, mean, add eps, rsqrt, two multiplies) over 65536 x 4096 float32 rows."""
import torch
import torch.nn as nn

ROWS = 65536
DIM = 4096


class Model(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.2 * torch.randn(dim))

    def forward(self, x):
        ms = x.pow(2).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(ms + self.eps) * self.weight


def get_inputs():
    return [torch.randn(ROWS, DIM) * 2.0]


def get_init_inputs():
    return [DIM]
