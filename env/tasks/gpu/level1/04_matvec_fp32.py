"""Single operator: float32 matrix-vector product y = W @ x with a 32768 x 32768 matrix (4 GiB read once)."""
import torch
import torch.nn as nn

ROWS = 32768
COLS = 32768


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, w, x):
        return torch.mv(w, x)


def get_inputs():
    return [torch.randn(ROWS, COLS) * COLS ** -0.5, torch.randn(COLS)]


def get_init_inputs():
    return []
