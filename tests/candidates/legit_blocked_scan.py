# task: tests/tasks/cumsum_long.py
# expect: ok
"""Legitimate: a running sum computed blockwise (sums within blocks of 256, then the blocks'
running totals added), the way a parallel scan orders it. It differs from the reference's
sequential float32 sums by about as much as the reference differs from the exact ones, which
the fixed atol of 1e-4 refused; the tolerance widened by the reference's own rounding error
takes it."""
import torch
import torch.nn as nn

BLOCK = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        rows, cols = x.shape
        blocks = x.reshape(rows, cols // BLOCK, BLOCK)
        inner = torch.cumsum(blocks, dim=2)
        totals = inner[:, :, -1]
        offsets = torch.cumsum(totals, dim=1) - totals
        return (inner + offsets.unsqueeze(2)).reshape(rows, cols)
