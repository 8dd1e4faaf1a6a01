"""Single operator: per-row cross-entropy loss (reduction none) of 16384 x 32000 float32 logits against integer targets."""
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 16384
CLASSES = 32000


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits, target):
        return F.cross_entropy(logits, target, reduction="none")


def get_inputs():
    return [torch.randn(ROWS, CLASSES) * 2.0, torch.randint(0, CLASSES, (ROWS,))]


def get_init_inputs():
    return []
