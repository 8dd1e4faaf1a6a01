"""Triton + algebra: batch norms folded into the convolutions; the second convolution runs without bias and one Triton pass does shift + residual + ReLU in place."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _shift_add_relu(y_ptr, x_ptr, b_ptr, n, hw, channels, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    c = (offs // hw) % channels
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + c, mask=mask, other=0.0)
    tl.store(y_ptr + offs, tl.maximum(y + b + x, 0.0), mask=mask)


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

    def forward(self, x):
        x = x.contiguous()
        s1 = self.gamma1 * torch.rsqrt(self.var1 + 1e-5)
        s2 = self.gamma2 * torch.rsqrt(self.var2 + 1e-5)
        y = F.conv2d(x, self.conv1.weight * s1[:, None, None, None], self.beta1 - self.mean1 * s1, padding=1).relu_()
        y = F.conv2d(y, self.conv2.weight * s2[:, None, None, None], None, padding=1).contiguous()
        shift = (self.beta2 - self.mean2 * s2).contiguous()
        n = y.numel()
        block = 4096
        _shift_add_relu[(triton.cdiv(n, block),)](y, x, shift, n, y.shape[2] * y.shape[3], y.shape[1],
                                                  BLOCK=block, num_warps=8)
        return y
