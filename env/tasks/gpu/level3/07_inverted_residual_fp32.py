"""Small architecture: MobileNetV2 inverted residual (1x1 expand x6, BN, ReLU6, 3x3 depthwise, BN, ReLU6, 1x1 project, BN, residual), float32, 128 x 64 x 56 x 56."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 128
CHANNELS = 64
SIZE = 56


class Model(nn.Module):
    def __init__(self, channels, expand=6):
        super().__init__()
        hidden = channels * expand
        self.expand = nn.Conv2d(channels, hidden, 1, bias=False)
        self.depthwise = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False)
        self.project = nn.Conv2d(hidden, channels, 1, bias=False)
        for i, c in ((1, hidden), (2, hidden), (3, channels)):
            self.register_parameter(f"gamma{i}", nn.Parameter(1.0 + 0.2 * torch.randn(c)))
            self.register_parameter(f"beta{i}", nn.Parameter(0.2 * torch.randn(c)))
            self.register_buffer(f"mean{i}", 0.2 * torch.randn(c))
            self.register_buffer(f"var{i}", 0.5 + torch.rand(c))

    def bn(self, y, i):
        return F.batch_norm(y, getattr(self, f"mean{i}"), getattr(self, f"var{i}"),
                            getattr(self, f"gamma{i}"), getattr(self, f"beta{i}"), training=False, eps=1e-5)

    def forward(self, x):
        y = F.relu6(self.bn(self.expand(x), 1))
        y = F.relu6(self.bn(self.depthwise(y), 2))
        y = self.bn(self.project(y), 3)
        return x + y


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs():
    return [CHANNELS]
