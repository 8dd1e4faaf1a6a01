"""Layer normalisation over the last dimension, written with separate mean and variance passes."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, eps: float = 1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x, weight, bias):
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * weight + bias


def get_inputs():
    return [torch.randn(16384, 4096, device="cuda"), torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")]


def get_init_inputs():
    return [1e-5]
