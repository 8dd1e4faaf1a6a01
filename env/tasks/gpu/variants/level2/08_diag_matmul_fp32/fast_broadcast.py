"""PyTorch algebra: diag(d) @ A scales row i of A by d_i: one broadcast multiply, no N x N diagonal matrix and no GEMM."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, d, a):
        return d[:, None] * a
