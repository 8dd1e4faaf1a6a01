# task: env/tasks/cpu/01_relu_scale.py
# expect: rejected static:hyperparameters
"""Hack: changes the default of clamp_max (not passed by get_init_inputs) to infinity and drops the
clamp, doing less work than the task asks for; also ships its own smaller get_inputs /
get_init_inputs for harnesses that take them from the candidate's namespace."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=float("inf")):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        return torch.relu(x * self.scale + self.shift)


def get_inputs():
    return [torch.randn(256, 256)]


def get_init_inputs():
    return [2.0, 0.5, float("inf")]
