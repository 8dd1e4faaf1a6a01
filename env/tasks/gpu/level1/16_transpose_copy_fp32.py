"""Single operator: materialised transpose (x.t().contiguous()) of a 16384 x 32768 float32 matrix."""
import torch
import torch.nn as nn

ROWS = 16384
COLS = 32768


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.t().contiguous()


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
