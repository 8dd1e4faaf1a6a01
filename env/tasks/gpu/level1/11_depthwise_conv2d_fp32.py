"""Single operator: 7x7 depthwise float32 convolution over 64 x 512 x 56 x 56 (groups = channels, padding 3)."""
import torch
import torch.nn as nn

BATCH = 64
CHANNELS = 512
SIZE = 56


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs():
    return [CHANNELS]
