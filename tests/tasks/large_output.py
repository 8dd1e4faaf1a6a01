"""An elementwise scale with an output of 2^25 + 7 elements: past float32's exact integers, where
positions computed in float32 round beyond the last element (the harness samples outputs at
positions it computes; a float linspace of them ended past the end and failed every task this
large on the GPU with a device-side assert)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 2.0


def get_inputs():
    return [torch.randn((1 << 25) + 7)]


def get_init_inputs():
    return []
