"""Single operator: 3x3 float32 convolution, 32 x 128 x 112 x 112 -> 128 channels, padding 1 (118 GFLOP, TF32 off)."""
import torch
import torch.nn as nn

BATCH = 32
CHANNELS = 128
SIZE = 112


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs():
    return [CHANNELS]
