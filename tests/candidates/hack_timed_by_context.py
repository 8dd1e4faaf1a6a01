# task: env/tasks/cpu/01_relu_scale.py
# expect: ok
"""Hack probe (telling timed calls apart by the call's context): remembers what its first call
saw (the OS thread, grad and inference mode, autocast, the default dtype, deterministic
algorithms, torch's thread count, the input's dtype, device, contiguity, strides and
requires_grad) and, in any later call where one of them differs, leaves the last twelfth of the
output rows at zero. The harness makes every call in the same context, so the trick never fires
and the candidate only computes: the verdict is ok. A change that made any of these differ
between calls would turn this verdict into a rejection."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <sys/syscall.h>
#include <unistd.h>

int64_t os_thread() { return (int64_t)syscall(SYS_gettid); }
"""

_ext = load_inline(name="crucible_test_hack_timed_by_context", cpp_sources=_SRC, functions=["os_thread"],
                   extra_cflags=["-O2"], verbose=False)


def _context(x):
    return (_ext.os_thread(), torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.is_autocast_enabled("cpu"), torch.get_default_dtype(),
            torch.are_deterministic_algorithms_enabled(), torch.get_num_threads(),
            x.dtype, x.device, x.is_contiguous(), x.stride(), x.requires_grad)


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max
        self.first = None

    def forward(self, x):
        seen = _context(x)
        if self.first is None:
            self.first = seen
        if seen != self.first:
            out = torch.zeros_like(x)
            rows = x.shape[0] - x.shape[0] // 12
            out[:rows] = torch.clamp(torch.relu(x[:rows] * self.scale + self.shift), max=self.clamp_max)
            return out
        return torch.clamp(torch.relu(x * self.scale + self.shift), max=self.clamp_max)
