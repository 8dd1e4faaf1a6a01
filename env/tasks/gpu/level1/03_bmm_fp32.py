"""Single operator: batched float32 matmul, 64 independent 1024 x 1024 x 1024 products (137 GFLOP)."""
import torch
import torch.nn as nn

BATCH = 64
M = 1024
N = 1024
K = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.bmm(a, b)


def get_inputs():
    return [torch.randn(BATCH, M, K) * K ** -0.5, torch.randn(BATCH, K, N)]


def get_init_inputs():
    return []
