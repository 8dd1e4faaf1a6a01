"""Elementwise chain: degree-5 polynomial c0 + c1 x + ... + c5 x^5 evaluated term by term with torch.pow."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, c0=0.5, c1=-1.0, c2=0.75, c3=0.25, c4=-0.125, c5=0.0625):
        super().__init__()
        self.coeffs = [c0, c1, c2, c3, c4, c5]

    def forward(self, x):
        y = torch.full_like(x, self.coeffs[0])
        for i in range(1, 6):
            y = y + self.coeffs[i] * torch.pow(x, i)
        return y


def get_inputs():
    return [torch.rand(512, 2048) * 2.0 - 1.0]


def get_init_inputs():
    return [0.5, -1.0, 0.75, 0.25, -0.125, 0.0625]
