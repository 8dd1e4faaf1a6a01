"""Triton: rows held in registers, max and sum of exp in one read of the input; only the row results are written."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _lse_rows(x_ptr, y_ptr, rows, cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK)
    rmask = r < rows
    mask = rmask[:, None] & (c < cols)[None, :]
    x = tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=mask, other=float("-inf"))
    m = tl.max(x, axis=1)
    e = tl.where(mask, tl.exp(x - m[:, None]), 0.0)
    s = tl.sum(e, axis=1)
    tl.store(y_ptr + r, m + tl.log(s), mask=rmask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        cols = x.shape[-1]
        if cols > 16384:
            raise ValueError("rows longer than 16384 are not supported")
        rows = x.numel() // cols
        y = torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device)
        block = triton.next_power_of_2(cols)
        per = max(1, 4096 // block)
        _lse_rows[(triton.cdiv(rows, per),)](x, y, rows, cols, ROWS=per, BLOCK=block, num_warps=8)
        return y
