"""Triton: residual add (rounded to bfloat16 as the reference does) and LayerNorm in float32 per row in one pass: two reads, one write."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _add_layernorm(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * cols + offs, mask=mask, other=0.0).to(tl.float32)
    h = (x + r).to(tl.bfloat16).to(tl.float32)
    mean = tl.sum(h, axis=0) / cols
    hc = tl.where(mask, h - mean, 0.0)
    var = tl.sum(hc * hc, axis=0) / cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * cols + offs, (hc * rstd * w + b).to(tl.bfloat16), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter((1.0 + 0.2 * torch.randn(dim)).to(torch.bfloat16))
        self.bias = nn.Parameter((0.2 * torch.randn(dim)).to(torch.bfloat16))

    def forward(self, x, residual):
        x = x.contiguous()
        residual = residual.contiguous()
        cols = x.shape[-1]
        if cols > 16384:
            raise ValueError("rows longer than 16384 are not supported")
        y = torch.empty_like(x)
        block = triton.next_power_of_2(cols)
        _add_layernorm[(x.numel() // cols,)](x, residual, self.weight, self.bias, y, cols, 1e-5,
                                             BLOCK=block, num_warps=8 if block >= 2048 else 4)
        return y
