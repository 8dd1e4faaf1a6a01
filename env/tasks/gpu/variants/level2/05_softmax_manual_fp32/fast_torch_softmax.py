"""PyTorch: the written-out softmax is torch.softmax over the last dimension: one kernel instead of five."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)
