"""relu(a * x + b) with tensor a and b, as three elementwise ops."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, a, b):
        return torch.relu(a * x + b)


def get_inputs():
    n = 128 * 1024 * 1024
    return [torch.randn(n, device="cuda"), torch.randn(n, device="cuda"), torch.randn(n, device="cuda")]


def get_init_inputs():
    return []
