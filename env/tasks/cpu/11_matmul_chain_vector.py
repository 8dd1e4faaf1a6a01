"""Diag-style algebra: A @ B @ v evaluated left to right (matrix-matrix first) where A @ (B @ v) needs two matrix-vector products."""
import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B, v):
        return A @ B @ v


def get_inputs():
    n = 768
    return [torch.randn(n, n) / math.sqrt(n), torch.randn(n, n) / math.sqrt(n), torch.randn(n)]


def get_init_inputs():
    return []
