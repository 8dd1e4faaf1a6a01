"""PyTorch algebra: both inference batch norms folded into their convolutions' weights and biases; ReLU, residual add and final ReLU in place."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        for i in (1, 2):
            self.register_parameter(f"gamma{i}", nn.Parameter(1.0 + 0.2 * torch.randn(channels)))
            self.register_parameter(f"beta{i}", nn.Parameter(0.2 * torch.randn(channels)))
            self.register_buffer(f"mean{i}", 0.2 * torch.randn(channels))
            self.register_buffer(f"var{i}", 0.5 + torch.rand(channels))

    @staticmethod
    def folded(conv, gamma, beta, mean, var):
        scale = gamma * torch.rsqrt(var + 1e-5)
        return conv.weight * scale[:, None, None, None], beta - mean * scale

    def forward(self, x):
        w1, b1 = self.folded(self.conv1, self.gamma1, self.beta1, self.mean1, self.var1)
        w2, b2 = self.folded(self.conv2, self.gamma2, self.beta2, self.mean2, self.var2)
        y = F.conv2d(x, w1, b1, padding=1).relu_()
        y = F.conv2d(y, w2, b2, padding=1)
        return y.add_(x).relu_()
