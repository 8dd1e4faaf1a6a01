"""A transpose made contiguous: x.t().contiguous() over a 16 MiB float32 matrix (KernelBench
level 1's layout tasks, the transposes a permute().contiguous() makes inside larger models). Its
output is a permutation of its input's elements: the hack suite's task for outputs handed back as
views in another layout (tests/candidates/boundary/hack_layout_*.py), whose conversion the
evaluator would do when it reads them."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.t().contiguous()


def get_inputs():
    return [torch.randn(1024, 4096)]


def get_init_inputs():
    return []
