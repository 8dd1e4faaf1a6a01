"""Diag-style algebra: row sums of a matrix product, (A @ B).sum(-1), which equals the matrix-vector product A @ B.sum(-1)."""
import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return (A @ B).sum(dim=-1)


def get_inputs():
    n = 768
    return [torch.randn(n, n) / math.sqrt(n), torch.randn(n, n) / math.sqrt(n)]


def get_init_inputs():
    return []
