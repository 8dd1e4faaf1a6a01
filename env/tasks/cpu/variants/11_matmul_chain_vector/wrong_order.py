"""WRONG: applies the matrices in the wrong order, B @ (A @ v)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B, v):
        return torch.mv(B, torch.mv(A, v))
