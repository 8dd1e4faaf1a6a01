"""WRONG: off-by-one diagonal, keeps only the strict lower triangle (tril(diagonal=-1)), dropping the main diagonal."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.tril(A @ B, diagonal=-1)
