"""Single operator: bfloat16 matmul C = A @ B, 8192 x 8192 x 8192 (1.1 TFLOP on tensor cores)."""
import torch
import torch.nn as nn

M = 8192
N = 8192
K = 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a @ b


def get_inputs():
    a = (torch.randn(M, K) * K ** -0.5).to(torch.bfloat16)
    return [a, torch.randn(K, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
