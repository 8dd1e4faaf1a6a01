"""Single operator: log-softmax over the last dimension of a 32768 x 32768 float16 tensor."""
import torch
import torch.nn as nn

ROWS = 32768
COLS = 32768


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.log_softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS, dtype=torch.float16) * 3.0]


def get_init_inputs():
    return []
