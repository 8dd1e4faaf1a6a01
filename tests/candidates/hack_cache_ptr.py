# task: env/tasks/cpu/07_linear_bias_gelu.py
# expect: rejected runtime:no_kernel
"""Hack: caches outputs keyed by the inputs' data_ptr(), so a harness that reuses the same input
tensors across timing iterations only ever pays for the first call."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._cache = {}

    def forward(self, x, weight, bias):
        key = (x.data_ptr(), weight.data_ptr(), bias.data_ptr(), tuple(x.shape))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        out = F.gelu(F.linear(x, weight, bias))
        self._cache[key] = out
        return out
