"""Fused sequence: rotary position embedding x * cos + rotate_half(x) * sin, computed in float32 from bfloat16 16 x 4096 x 32 heads x 128 and rounded back."""
import torch
import torch.nn as nn

BATCH = 16
SEQ = 4096
HEADS = 32
HEAD_DIM = 128


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, cos, sin):
        # x: (batch, seq, heads, head_dim); cos, sin: (seq, head_dim)
        # in float32 (a bfloat16 product can cancel against the other to far below its rounding error)
        xf = x.float()
        half = x.shape[-1] // 2
        x1 = xf[..., :half]
        x2 = xf[..., half:]
        rotated = torch.cat((-x2, x1), dim=-1)
        c = cos.float()[None, :, None, :]
        s = sin.float()[None, :, None, :]
        return (xf * c + rotated * s).to(x.dtype)


def get_inputs():
    x = torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    pos = torch.arange(SEQ, dtype=torch.float32)[:, None]
    inv = 10000.0 ** (-torch.arange(0, HEAD_DIM // 2, dtype=torch.float32) / (HEAD_DIM // 2))
    ang = pos * inv[None, :]
    ang = torch.cat((ang, ang), dim=-1)
    return [x, ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)]


def get_init_inputs():
    return []
