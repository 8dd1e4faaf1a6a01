"""A convolution followed by BatchNorm (KernelBench level 2's Conv2d_BatchNorm pattern), small
enough for the CPU. In training mode BatchNorm normalises with the batch's own statistics; in eval
mode (evaluator.eval_mode) with its running statistics, and then it is an affine map per channel
that a kernel may fold into the convolution: tests/modes/fold_batchnorm.py."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bn = nn.BatchNorm2d(out_channels)
        with torch.no_grad():  # running statistics other than the defaults, as a trained model has
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return self.bn(self.conv(x))


def get_inputs():
    return [torch.randn(8, 16, 32, 32)]


def get_init_inputs():
    return [16, 32, 3]
