"""A Triton kernel: GELU (tanh form), scale and shift fused in one pass."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _gelu_affine(x_ptr, s_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    s = tl.load(s_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0  # tanh
    g = 0.5 * x * (1.0 + t)
    tl.store(out_ptr + offs, g * s + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, scale, shift):
        out = torch.empty_like(x)
        n = x.numel()
        grid = (triton.cdiv(n, 4096),)
        _gelu_affine[grid](x, scale, shift, out, n, BLOCK=4096)
        return out
