# task: env/tasks/cpu/01_relu_scale.py
# expect: runtime_error
"""A fault of the candidate's own: its Triton kernel stores far outside any allocation (an illegal
address, which ends the CUDA context of the process that launched it). Its verdict is
runtime_error; the evaluator, the reference's worker and any other verdict in flight on the device
go on (tests/gpu/test_gpu_evaluator.cpp, the fault cases)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _scale_shift_far(x_ptr, y_ptr, n, scale, shift, top, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < n
    v = tl.load(x_ptr + offs, mask=keep) * scale + shift
    v = tl.minimum(tl.maximum(v, 0.0), top)
    tl.store(y_ptr + offs + (1 << 40), v, mask=keep)  # a terabyte past the output


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale, self.shift, self.clamp_max = scale, shift, clamp_max

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        _scale_shift_far[(triton.cdiv(n, 1024),)](x, y, n, self.scale, self.shift, self.clamp_max, BLOCK=1024)
        return y
