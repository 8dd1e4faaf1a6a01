# task: env/tasks/cpu/09_diag_matmul.py
# expect: ok
"""Legitimate: diag(a) @ B rewritten as the row scaling a[:, None] * B (exact algebra, ~30x)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, B):
        return a.unsqueeze(1) * B
