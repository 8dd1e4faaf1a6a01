"""Fused sequence: residual add then LayerNorm with affine weights, bfloat16, 131072 x 4096 rows."""
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 131072
DIM = 4096


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter((1.0 + 0.2 * torch.randn(dim)).to(torch.bfloat16))
        self.bias = nn.Parameter((0.2 * torch.randn(dim)).to(torch.bfloat16))

    def forward(self, x, residual):
        h = x + residual
        return F.layer_norm(h, (h.shape[-1],), self.weight, self.bias, 1e-5)


def get_inputs():
    return [torch.randn(ROWS, DIM, dtype=torch.bfloat16), torch.randn(ROWS, DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return [DIM]
