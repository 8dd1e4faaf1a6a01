"""Matmul family: y = gelu(x @ W^T + b) with the exact (erf) GELU written out; K is small so the epilogue passes dominate."""
import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, weight, bias):
        y = x @ weight.t()
        y = y + bias
        return 0.5 * y * (1.0 + torch.erf(y / math.sqrt(2.0)))


def get_inputs():
    x = torch.randn(2048, 128)
    weight = torch.randn(512, 128) / math.sqrt(128.0)
    bias = 0.5 * torch.randn(512)
    return [x, weight, bias]


def get_init_inputs():
    return []
