"""WRONG: rotate_half with the sign on the wrong half, cat(x2, -x1) instead of cat(-x2, x1)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, cos, sin):
        half = x.shape[-1] // 2
        rotated = torch.cat((x[..., half:], -x[..., :half]), dim=-1)
        return x * cos[None, :, None, :] + rotated * sin[None, :, None, :]
