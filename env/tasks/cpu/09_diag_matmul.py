"""Diag-style algebra: torch.diag(a) @ B, a dense N x N matmul where a row scaling a[:, None] * B suffices."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, B):
        return torch.diag(a) @ B


def get_inputs():
    return [torch.randn(768), torch.randn(768, 1024)]


def get_init_inputs():
    return []
