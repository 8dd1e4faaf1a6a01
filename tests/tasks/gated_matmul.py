"""A product gated elementwise: (a @ b) * g (a GLU's gate or a fused epilogue's scale, with the
gate as an input). Three floating inputs, each scaled by the evaluator's distributions: on
distribution 3 (x32 each) the outputs are 32^3 times larger and so is the reference's own
rounding error, which sets the slack the timed rounds allow (docs/evaluator.md, Correctness).
The hack suite's task for precision dropped in the timed calls
(tests/candidates/boundary/hack_precision_*.py)."""
import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b, g):
        return (a @ b) * g


def get_inputs():
    n = 1024
    return [torch.randn(n, n) / math.sqrt(n), torch.randn(n, n), torch.randn(n, n)]


def get_init_inputs():
    return []
