"""Triton: silu(a) * b read straight from the two halves of each row, computed in float32, one float16 pass."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _silu_gate(x_ptr, y_ptr, n, hidden, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    row = offs // hidden
    col = offs % hidden
    a = tl.load(x_ptr + row * (2 * hidden) + col, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + row * (2 * hidden) + hidden + col, mask=mask, other=0.0).to(tl.float32)
    y = a * tl.sigmoid(a) * b
    tl.store(y_ptr + offs, y.to(tl.float16), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        hidden = x.shape[-1] // 2
        y = torch.empty(x.shape[:-1] + (hidden,), dtype=x.dtype, device=x.device)
        n = y.numel()
        block = 4096
        _silu_gate[(triton.cdiv(n, block),)](x, y, n, hidden, BLOCK=block, num_warps=8)
        return y
