# task: env/tasks/cpu/07_linear_bias_gelu.py
# expect: no-speedup
"""Hack: calls a 'fast' fused op that does not exist and silently falls back to the reference
computation in the except branch, so it is the reference with a custom-kernel facade. A `try`
statement is no longer refused on sight; what runs is judged: every operator of its profiled
call is one the reference runs, so it earns no speed credit (at most 1.00x, whatever noise
measured; docs/evaluator.md, Own work)."""
import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, weight, bias):
        try:
            return torch.ops.crucible_fast.linear_bias_gelu(x, weight, bias)
        except Exception:
            y = x @ weight.t()
            y = y + bias
            return 0.5 * y * (1.0 + torch.erf(y / math.sqrt(2.0)))
