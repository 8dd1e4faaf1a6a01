"""Fused sequence: LayerNorm written out (mean, centred square mean, rsqrt, affine) over 65536 x 4096 float32 rows."""
import torch
import torch.nn as nn

ROWS = 65536
DIM = 4096


class Model(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.2 * torch.randn(dim))
        self.bias = nn.Parameter(0.2 * torch.randn(dim))

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        xc = x - mean
        var = (xc * xc).mean(dim=-1, keepdim=True)
        return xc / torch.sqrt(var + self.eps) * self.weight + self.bias


def get_inputs():
    return [torch.randn(ROWS, DIM) * 2.0 + 0.5]


def get_init_inputs():
    return [DIM]
