"""Fused sequence: row log-sum-exp written out (max, subtract, exp, sum, log, add) over 262144 x 2048 float32 rows (each row with its own offset)."""
import torch
import torch.nn as nn

ROWS = 262144
COLS = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        m = x.max(dim=-1, keepdim=True).values
        return (m + torch.log(torch.exp(x - m).sum(dim=-1, keepdim=True))).squeeze(-1)


def get_inputs():
    return [torch.randn(ROWS, COLS) * 3.0 + torch.randn(ROWS, 1) * 4.0]


def get_init_inputs():
    return []
