"""Single operator: softmax over the last dimension (256) of a 2097152 x 256 float32 tensor (2 GiB in, 2 GiB out)."""
import torch
import torch.nn as nn

ROWS = 2097152
COLS = 256


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS) * 2.0]


def get_init_inputs():
    return []
