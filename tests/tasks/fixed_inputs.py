"""One-hot rows of fixed class indices: get_inputs() draws nothing, so every call gets the same
input and the same output (the hack suite's task for candidates that return a stored output;
the physics floor refuses them)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 4096
CLASSES = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, idx):
        return F.one_hot(idx, CLASSES).to(torch.float32)


def get_inputs():
    return [torch.arange(ROWS, dtype=torch.int64) * 7 % CLASSES]


def get_init_inputs():
    return []
