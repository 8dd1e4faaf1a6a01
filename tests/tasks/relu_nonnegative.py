"""ReLU of inputs from torch.rand: every input the task draws is non-negative (the hack suite's
task for candidates that assume the domain of the inputs they were shown)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.rand(1024, 1024)]


def get_init_inputs():
    return []
