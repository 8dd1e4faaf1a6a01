"""WRONG: uses the tanh approximation of GELU instead of the exact erf form (differs by up to ~5e-4)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, weight, bias):
        return F.gelu(F.linear(x, weight, bias), approximate="tanh")
