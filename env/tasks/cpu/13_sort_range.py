"""Short-circuit: per-row range (max - min) computed by fully sorting each row and taking the two ends."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        s = torch.sort(x, dim=-1).values
        return s[:, -1] - s[:, 0]


def get_inputs():
    return [torch.randn(512, 512) * (0.5 + torch.rand(512, 1))]


def get_init_inputs():
    return []
