"""Short-circuit (masked): torch.tril(A @ B) computes the full product and then discards the strict upper triangle."""
import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.tril(A @ B)


def get_inputs():
    n, k = 1024, 256
    return [torch.randn(n, k) / math.sqrt(k), torch.randn(k, n)]


def get_init_inputs():
    return []
