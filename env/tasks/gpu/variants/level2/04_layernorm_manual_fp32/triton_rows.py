"""Triton: one program per row, the row held in registers: mean, centred variance and the affine map in one read and one write."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _layernorm_rows(x_ptr, w_ptr, b_ptr, y_ptr, cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / cols
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + row * cols + offs, xc * rstd * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.2 * torch.randn(dim))
        self.bias = nn.Parameter(0.2 * torch.randn(dim))

    def forward(self, x):
        x = x.contiguous()
        cols = x.shape[-1]
        if cols > 16384:
            raise ValueError("rows longer than 16384 are not supported")
        y = torch.empty_like(x)
        block = triton.next_power_of_2(cols)
        _layernorm_rows[(x.numel() // cols,)](x, self.weight, self.bias, y, cols, float(self.eps),
                                              BLOCK=block, num_warps=8 if block >= 2048 else 4)
        return y
