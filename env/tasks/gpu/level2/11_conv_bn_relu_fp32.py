"""Fused sequence: 3x3 convolution, inference batch norm (running statistics), ReLU; float32 64 x 128 x 56 x 56."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 64
CHANNELS = 128
SIZE = 56


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.gamma = nn.Parameter(1.0 + 0.2 * torch.randn(channels))
        self.beta = nn.Parameter(0.2 * torch.randn(channels))
        self.register_buffer("running_mean", 0.2 * torch.randn(channels))
        self.register_buffer("running_var", 0.5 + torch.rand(channels))

    def forward(self, x):
        y = self.conv(x)
        y = F.batch_norm(y, self.running_mean, self.running_var, self.gamma, self.beta, training=False, eps=1e-5)
        return F.relu(y)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs():
    return [CHANNELS]
