"""Small architecture: ResNet basic block (conv3x3, inference batch norm, ReLU, conv3x3, batch norm, identity add, ReLU), float32, 32 x 128 x 56 x 56."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32
CHANNELS = 128
SIZE = 56


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        for i in (1, 2):
            self.register_parameter(f"gamma{i}", nn.Parameter(1.0 + 0.2 * torch.randn(channels)))
            self.register_parameter(f"beta{i}", nn.Parameter(0.2 * torch.randn(channels)))
            self.register_buffer(f"mean{i}", 0.2 * torch.randn(channels))
            self.register_buffer(f"var{i}", 0.5 + torch.rand(channels))

    def forward(self, x):
        y = self.conv1(x)
        y = F.batch_norm(y, self.mean1, self.var1, self.gamma1, self.beta1, training=False, eps=1e-5)
        y = F.relu(y)
        y = self.conv2(y)
        y = F.batch_norm(y, self.mean2, self.var2, self.gamma2, self.beta2, training=False, eps=1e-5)
        return F.relu(y + x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs():
    return [CHANNELS]
