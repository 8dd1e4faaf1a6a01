"""Fused sequence: (x @ W).sum(dim=1) for 8192 x 8192 float32 operands: a 1.1 TFLOP GEMM whose result is only summed."""
import torch
import torch.nn as nn

M = 8192
K = 8192
N = 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, w):
        return (x @ w).sum(dim=1)


def get_inputs():
    return [torch.randn(M, K) * K ** -0.5, torch.randn(K, N) * N ** -0.5]


def get_init_inputs():
    return []
