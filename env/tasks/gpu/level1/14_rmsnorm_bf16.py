"""Single operator: F.rms_norm over the last 8192 features of 131072 bfloat16 rows, with a random weight."""
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 131072
DIM = 8192


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter((1.0 + 0.2 * torch.randn(dim)).to(torch.bfloat16))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, 1e-6)


def get_inputs():
    return [torch.randn(ROWS, DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return [DIM]
