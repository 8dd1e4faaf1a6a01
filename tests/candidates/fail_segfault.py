# task: env/tasks/cpu/01_relu_scale.py
# expect: runtime_error
"""Failure mode: a load_inline C++ extension that writes through a null pointer (SIGSEGV in forward)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
static float* volatile g_target = nullptr;  // the compiler cannot assume anything about it

torch::Tensor crash(torch::Tensor x) {
  volatile float* p = g_target;
  *p = 1.0f;  // write through a null pointer: SIGSEGV
  return x;
}
"""

_ext = load_inline(name="crucible_test_fail_segfault", cpp_sources=_SRC,
                   functions=["crash"], extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        return _ext.crash(x)
