"""Single operator: column sums of a 65536 x 16384 float32 matrix (reduction over the strided dimension)."""
import torch
import torch.nn as nn

ROWS = 65536
COLS = 16384


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.sum(dim=0)


def get_inputs():
    return [torch.randn(ROWS, COLS) * ROWS ** -0.5]


def get_init_inputs():
    return []
