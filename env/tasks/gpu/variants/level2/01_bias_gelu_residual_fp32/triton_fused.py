"""Triton: one fused pass y = gelu(x + bias) + residual (erf GELU in float32), 2048-element blocks: 3 tensor passes instead of 7."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _bias_gelu_residual(x_ptr, b_ptr, r_ptr, y_ptr, n, cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs % cols, mask=mask, other=0.0)
    r = tl.load(r_ptr + offs, mask=mask, other=0.0)
    h = x + b
    g = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))
    tl.store(y_ptr + offs, g + r, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.bias = nn.Parameter(0.5 * torch.randn(cols))

    def forward(self, x, residual):
        x = x.contiguous()
        residual = residual.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        block = 2048
        _bias_gelu_residual[(triton.cdiv(n, block),)](x, self.bias, residual, y, n, x.shape[-1],
                                                      BLOCK=block, num_warps=8)
        return y
