"""Global average pooling broadcast back to the input's size (the image-pooling branch of
PSPNet/DeepLab's ASPP, a squeeze-excitation's context): a mean over each channel's plane, then
nearest upsampling to the plane's size. Every element of a plane's output is the same value: the
hack suite's task for an output handed back as a broadcast view (stride 0) of a smaller buffer
(tests/candidates/boundary/hack_layout_*.py)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        pooled = F.adaptive_avg_pool2d(x, 1)
        return F.interpolate(pooled, size=x.shape[-2:], mode="nearest")


def get_inputs():
    return [torch.randn(16, 64, 64, 64)]


def get_init_inputs():
    return []
