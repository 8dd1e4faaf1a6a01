"""Single operator: exact (erf) GELU over a 16384 x 32768 float32 tensor (2 GiB in, 2 GiB out)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 16384
COLS = 32768


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.gelu(x)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
