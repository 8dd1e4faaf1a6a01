"""PyTorch algebra: inference batch norm folded into the convolution's weight and bias, ReLU in place on the convolution's own output."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.gamma = nn.Parameter(1.0 + 0.2 * torch.randn(channels))
        self.beta = nn.Parameter(0.2 * torch.randn(channels))
        self.register_buffer("running_mean", 0.2 * torch.randn(channels))
        self.register_buffer("running_var", 0.5 + torch.rand(channels))

    def forward(self, x):
        scale = self.gamma * torch.rsqrt(self.running_var + 1e-5)
        w = self.conv.weight * scale[:, None, None, None]
        b = self.beta - self.running_mean * scale
        return F.conv2d(x, w, b, padding=1).relu_()
