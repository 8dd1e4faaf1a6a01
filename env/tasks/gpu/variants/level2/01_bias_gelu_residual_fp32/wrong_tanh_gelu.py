"""WRONG: the tanh approximation of GELU instead of the exact erf form (differs by up to ~5e-4)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.bias = nn.Parameter(0.5 * torch.randn(cols))

    def forward(self, x, residual):
        return F.gelu(x + self.bias, approximate="tanh") + residual
