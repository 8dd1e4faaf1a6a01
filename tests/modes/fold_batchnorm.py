# task: tests/tasks/conv_batchnorm.py
"""Legitimate in eval mode only: folds BatchNorm's running statistics and affine parameters into
the convolution's weights and bias, one convolution instead of a convolution and a normalisation,
as inference engines do. In training mode BatchNorm normalises with each batch's statistics, and
the folded convolution computes another function: incorrect (evaluator.eval_mode false, the
default), ok with evaluator.eval_mode true (tests/integration/test_evaluator.cpp). Not in
tests/candidates: its verdict depends on that setting."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bn = nn.BatchNorm2d(out_channels)
        with torch.no_grad():  # the reference's construction, draw for draw
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        scale = self.bn.weight / torch.sqrt(self.bn.running_var + self.bn.eps)
        w = self.conv.weight * scale[:, None, None, None]
        b = (self.conv.bias - self.bn.running_mean) * scale + self.bn.bias
        return F.conv2d(x, w, b)
