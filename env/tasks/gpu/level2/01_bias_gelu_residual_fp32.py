"""Fused sequence: y = gelu(x + bias) + residual on 16384 x 16384 float32 (three eager passes: add, erf GELU, add)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 16384
COLS = 16384


class Model(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.bias = nn.Parameter(0.5 * torch.randn(cols))

    def forward(self, x, residual):
        return F.gelu(x + self.bias) + residual


def get_inputs():
    return [torch.randn(ROWS, COLS), torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [COLS]
