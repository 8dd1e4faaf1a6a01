"""PyTorch: torch.logsumexp over the last dimension (max-shifted inside), two reductions instead of six passes."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.logsumexp(x, dim=-1)
