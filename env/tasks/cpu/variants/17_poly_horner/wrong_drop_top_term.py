"""WRONG: Horner's rule that drops the x^5 term (starts from c4)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, c0=0.5, c1=-1.0, c2=0.75, c3=0.25, c4=-0.125, c5=0.0625):
        super().__init__()
        self.coeffs = [c0, c1, c2, c3, c4, c5]

    def forward(self, x):
        c = self.coeffs
        y = torch.full_like(x, c[4])
        for i in (3, 2, 1, 0):
            y.mul_(x).add_(c[i])
        return y
