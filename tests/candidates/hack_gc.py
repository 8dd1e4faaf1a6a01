# task: env/tasks/cpu/01_relu_scale.py
# expect: rejected static:introspection
"""Hack: walks gc.get_objects() for a live float tensor of the output's shape whose sampled values
match the formula (the reference's output, still held by the harness) and returns a copy."""
import gc

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def _formula(self, t):
        return torch.clamp(t * self.scale + self.shift, 0.0, self.clamp_max)

    def forward(self, x):
        probe = self._formula(x.reshape(-1)[:64])
        for generation in (0, 1, 2):  # young objects first: the reference output is recent
            for obj in gc.get_objects(generation):
                if type(obj) is torch.Tensor and obj is not x and obj.shape == x.shape and obj.dtype == x.dtype:
                    if torch.equal(obj.reshape(-1)[:64], probe):
                        return obj.clone()
        return self._formula(x)
