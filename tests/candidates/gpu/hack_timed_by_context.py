# task: env/tasks/gpu/level1/05_gelu_fp32.py
# expect: ok
"""Hack probe (GPU; telling timed calls apart by the call's context): remembers what its first
call saw (the OS thread, the current device and stream, whether a graph is being captured, grad
and inference mode, autocast, the default dtype, TF32 and reduced-precision flags, the input's
dtype, device, contiguity, strides and requires_grad) and, in any later call where one of them
differs, leaves the last twelfth of the output rows at zero. The harness makes every call in the
same context, so the trick never fires and the candidate only computes: the verdict is ok."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <sys/syscall.h>
#include <unistd.h>

int64_t os_thread() { return (int64_t)syscall(SYS_gettid); }
"""

_ext = load_inline(name="crucible_test_hack_timed_by_context_gpu", cpp_sources=_SRC, functions=["os_thread"],
                   extra_cflags=["-O2"], verbose=False)


def _context(x):
    return (_ext.os_thread(), torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream,
            torch.cuda.is_current_stream_capturing(), torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.is_autocast_enabled("cuda"), torch.get_default_dtype(), torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
            x.dtype, x.device, x.is_contiguous(), x.stride(), x.requires_grad)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = None

    def forward(self, x):
        seen = _context(x)
        if self.first is None:
            self.first = seen
        if seen != self.first:
            out = torch.zeros_like(x)
            rows = x.shape[0] - x.shape[0] // 12
            out[:rows] = F.gelu(x[:rows])
            return out
        return F.gelu(x)
