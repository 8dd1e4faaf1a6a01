"""Matmul family / algebra: pairwise squared Euclidean distances via a broadcast (N, M, D) difference tensor."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        d = x[:, None, :] - y[None, :, :]
        return (d * d).sum(dim=-1)


def get_inputs():
    return [torch.randn(128, 64), torch.randn(512, 64)]


def get_init_inputs():
    return []
