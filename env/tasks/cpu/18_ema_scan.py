"""Cumulative op: exponential moving sum y_t = decay * y_{t-1} + x_t along rows, computed as x @ D with an L x L Toeplitz decay matrix."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, decay=0.9):
        super().__init__()
        self.decay = decay

    def forward(self, x):
        L = x.shape[-1]
        idx = torch.arange(L, device=x.device)
        diff = (idx[None, :] - idx[:, None]).to(x.dtype)  # diff[i, j] = j - i
        D = torch.where(diff >= 0, torch.pow(torch.full_like(diff, self.decay), diff), torch.zeros_like(diff))
        return x @ D


def get_inputs():
    return [torch.randn(1024, 512)]


def get_init_inputs():
    return [0.9]
