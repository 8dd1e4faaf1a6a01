"""Single operator: LayerNorm over the last 4096 features of 131072 float32 rows, with random affine weights."""
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 131072
DIM = 4096


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.2 * torch.randn(dim))
        self.bias = nn.Parameter(0.2 * torch.randn(dim))

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, 1e-5)


def get_inputs():
    return [torch.randn(ROWS, DIM) * 3.0 + 1.0]


def get_init_inputs():
    return [DIM]
