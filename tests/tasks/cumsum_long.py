"""Running sums along rows of 65,536 elements of about 100 in size: the sums reach tens of
thousands, where float32's spacing is about 4e-3, so the float32 reference is off the exact
sums by about 1e-3 everywhere, also where a row's sum passes near zero and rtol gives nothing;
another correct order of summation differs from it by a few times that (the tolerance widened
by the reference's own rounding error; docs/evaluator.md, Correctness)."""
import torch
import torch.nn as nn

ROWS = 8
COLS = 1 << 16


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.cumsum(x, dim=1)


def get_inputs():
    return [torch.randn(ROWS, COLS) * 100]


def get_init_inputs():
    return []
