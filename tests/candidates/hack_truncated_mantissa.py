# task: tests/tasks/cumsum_long.py
# expect: incorrect
"""Hack (lower precision without a low-precision dtype in sight): the inputs' float32 mantissas
cut to 16 bits by masking their bit patterns, then the running sums taken blockwise. Each input
moves by up to 100 * 2^-17, and the running sums drift by far more than the reference's own
rounding error (about 1e-3 on this task), so the tolerance widened by that error does not take
it: precision is judged by the output's error, not by the dtypes named in the source."""
import torch
import torch.nn as nn

BLOCK = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        bits = x.contiguous().view(torch.int32) & -128  # the low 7 of 23 mantissa bits cleared
        x = bits.view(torch.float32)
        rows, cols = x.shape
        blocks = x.reshape(rows, cols // BLOCK, BLOCK)
        inner = torch.cumsum(blocks, dim=2)
        totals = inner[:, :, -1]
        offsets = torch.cumsum(totals, dim=1) - totals
        return (inner + offsets.unsqueeze(2)).reshape(rows, cols)
