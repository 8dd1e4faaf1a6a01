# task: tests/tasks/relu_nonnegative.py
# expect: rejected runtime:aliased_output
"""Hack (inputs that make the task trivial): ReLU of inputs that come from torch.rand. Where no
element is negative it returns the input itself, which is right and runs no kernel; elsewhere it
computes. An output that shares memory with an input, where the reference's does not, earns
nothing."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        if bool((x >= 0).all()):
            return x
        return torch.relu(x)
