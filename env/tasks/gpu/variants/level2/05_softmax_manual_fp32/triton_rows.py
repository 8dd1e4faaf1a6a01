"""Triton: several rows per program, each row held in registers: max, exp, sum and scale in one read and one write."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _softmax_rows(x_ptr, y_ptr, rows, cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK)
    mask = (r < rows)[:, None] & (c < cols)[None, :]
    ptrs = r[:, None] * cols + c[None, :]
    x = tl.load(x_ptr + ptrs, mask=mask, other=float("-inf"))
    m = tl.max(x, axis=1)
    e = tl.exp(x - m[:, None])
    e = tl.where(mask, e, 0.0)
    s = tl.sum(e, axis=1)
    tl.store(y_ptr + ptrs, e / s[:, None], mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        cols = x.shape[-1]
        if cols > 16384:
            raise ValueError("rows longer than 16384 are not supported")
        rows = x.numel() // cols
        y = torch.empty_like(x)
        block = triton.next_power_of_2(cols)
        per = max(1, 4096 // block)
        _softmax_rows[(triton.cdiv(rows, per),)](x, y, rows, cols, ROWS=per, BLOCK=block, num_warps=8)
        return y
