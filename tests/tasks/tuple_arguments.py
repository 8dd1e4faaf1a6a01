"""A task whose constructor arguments and call inputs hold tuples (a stride, a window): across the
trust boundary they reach the candidate's process as tuples, not as JSON's lists."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, stride=(1, 1), scale=2.0):
        super().__init__()
        self.stride = stride
        self.scale = scale

    def forward(self, x, window):
        return x[:, :: self.stride[0]] * self.scale + window[0]


def get_inputs():
    return [torch.randn(256, 512), (0.5, 1.5)]


def get_init_inputs():
    return [(2, 3), 2.0]
