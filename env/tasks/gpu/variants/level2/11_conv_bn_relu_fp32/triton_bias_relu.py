"""Triton + algebra: batch norm's scale folded into the weights, the convolution without bias, then one in-place Triton pass adds the folded shift and applies ReLU."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _bias_relu_nchw(y_ptr, b_ptr, n, hw, channels, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    c = (offs // hw) % channels
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + c, mask=mask, other=0.0)
    tl.store(y_ptr + offs, tl.maximum(y + b, 0.0), mask=mask)


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
        shift = (self.beta - self.running_mean * scale).contiguous()
        y = F.conv2d(x, self.conv.weight * scale[:, None, None, None], None, padding=1).contiguous()
        n = y.numel()
        block = 4096
        _bias_relu_nchw[(triton.cdiv(n, block),)](y, shift, n, y.shape[2] * y.shape[3], y.shape[1],
                                                  BLOCK=block, num_warps=8)
        return y
