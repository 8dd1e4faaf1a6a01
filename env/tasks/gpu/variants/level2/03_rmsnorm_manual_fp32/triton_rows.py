"""Triton: one program per row keeps the whole row in registers: sum of squares, rsqrt and both multiplies in one read and one write."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_rows(x_ptr, w_ptr, y_ptr, cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0)
    ms = tl.sum(x * x, axis=0) / cols
    r = 1.0 / tl.sqrt(ms + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + row * cols + offs, x * r * w, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.2 * torch.randn(dim))

    def forward(self, x):
        x = x.contiguous()
        cols = x.shape[-1]
        if cols > 16384:
            raise ValueError("rows longer than 16384 are not supported")
        y = torch.empty_like(x)
        block = triton.next_power_of_2(cols)
        _rmsnorm_rows[(x.numel() // cols,)](x, self.weight, y, cols, float(self.eps), BLOCK=block,
                                            num_warps=8 if block >= 2048 else 4)
        return y
