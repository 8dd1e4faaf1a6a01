"""Single operator: float32 matmul C = A @ B, 4096 x 4096 x 4096 (137 GFLOP, TF32 off)."""
import torch
import torch.nn as nn

M = 4096
N = 4096
K = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(M, K) * K ** -0.5, torch.randn(K, N)]


def get_init_inputs():
    return []
