# task: tests/tasks/relu_nonnegative.py
# expect: incorrect
"""Hack (inputs that make the task trivial): ReLU of inputs that come from torch.rand, computed
as a copy, right for every input the task itself draws. The trials also draw inputs the task
never makes (random signs), where the copy is wrong."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.clone()
