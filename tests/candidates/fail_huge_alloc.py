# task: env/tasks/cpu/01_relu_scale.py
# expect: runtime_error
"""Failure mode: forward asks for a ~1 TiB float32 tensor and fills it (allocation fails: out of memory)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        scratch = torch.empty(1 << 38, dtype=torch.float32)  # 2^38 * 4 bytes = 1 TiB
        scratch.fill_(0.0)
        return torch.clamp(torch.relu(x * self.scale + self.shift), max=self.clamp_max)
