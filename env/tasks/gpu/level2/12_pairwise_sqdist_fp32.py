"""Fused sequence: pairwise squared distances ((x_i - y_j)^2).sum(-1) via a broadcast 2048 x 2048 x 256 float32 intermediate (points with random scales)."""
import torch
import torch.nn as nn

N = 2048
M = 2048
DIM = 256


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        diff = x[:, None, :] - y[None, :, :]
        return (diff * diff).sum(dim=-1)


def get_inputs():
    # a random scale per point, so distances do not all concentrate around one value
    x = torch.randn(N, DIM) * (torch.randn(N, 1) * DIM ** -0.5)
    y = torch.randn(M, DIM) * (torch.randn(M, 1) * DIM ** -0.5)
    return [x, y]


def get_init_inputs():
    return []
