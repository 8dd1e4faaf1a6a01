"""WRONG: uses the unbiased variance (divides by N - 1), off by a factor sqrt(N / (N - 1))."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, eps=1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x, weight, bias):
        var, mean = torch.var_mean(x, dim=-1, unbiased=True, keepdim=True)
        y = (x - mean) * torch.rsqrt(var + self.eps)
        return y * weight + bias
