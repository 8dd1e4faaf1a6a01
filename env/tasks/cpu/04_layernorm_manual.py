"""Reduction: layer norm over the last dim (1024) with affine weight/bias, written as explicit mean / var / normalise passes."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, eps=1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x, weight, bias):
        mean = x.mean(dim=-1, keepdim=True)
        xc = x - mean
        var = (xc * xc).mean(dim=-1, keepdim=True)
        y = xc / torch.sqrt(var + self.eps)
        return y * weight + bias


def get_inputs():
    x = torch.randn(2048, 1024) * 2.0 + torch.randn(2048, 1)
    weight = 1.0 + 0.5 * torch.randn(1024)
    bias = torch.randn(1024)
    return [x, weight, bias]


def get_init_inputs():
    return [1e-5]
