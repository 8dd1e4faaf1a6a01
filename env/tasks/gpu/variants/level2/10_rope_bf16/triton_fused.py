"""Triton: one program per (batch, position) rotates all heads at once: x * cos + rotate_half(x) * sin in float32, one bfloat16 read and write."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rope(x_ptr, cos_ptr, sin_ptr, y_ptr, seq, heads, dim, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)  # = batch * seq + position
    pos = pid % seq
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    half = dim // 2
    mask_d = d < dim
    mask = (h < heads)[:, None] & mask_d[None, :]
    base = pid * heads * dim
    offs = base + h[:, None] * dim + d[None, :]
    partner = tl.where(d < half, d + half, d - half)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(x_ptr + base + h[:, None] * dim + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    rot = tl.where((d < half)[None, :], -xp, xp)
    c = tl.load(cos_ptr + pos * dim + d, mask=mask_d, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + pos * dim + d, mask=mask_d, other=0.0).to(tl.float32)
    y = x * c[None, :] + rot * s[None, :]
    tl.store(y_ptr + offs, y.to(tl.bfloat16), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, cos, sin):
        x = x.contiguous()
        cos = cos.contiguous()
        sin = sin.contiguous()
        b, s, h, d = x.shape
        y = torch.empty_like(x)
        _rope[(b * s,)](x, cos, sin, y, s, h, d, BLOCK_H=triton.next_power_of_2(h),
                        BLOCK_D=triton.next_power_of_2(d), num_warps=4)
        return y
