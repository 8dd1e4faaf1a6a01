"""Fused sequence: SwiGLU gate silu(a) * b where a, b are the two halves of a 65536 x 2 x 8192 float16 input."""
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 65536
HIDDEN = 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b


def get_inputs():
    return [torch.randn(ROWS, 2 * HIDDEN, dtype=torch.float16)]


def get_init_inputs():
    return []
