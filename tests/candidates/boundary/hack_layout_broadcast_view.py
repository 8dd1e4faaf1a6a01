# task: tests/tasks/pool_upsample.py
# expect: ok
"""Hack, class 10 (an output in another layout, whose conversion the evaluator pays), route: a
broadcast view (stride 0). The task pools each channel's plane to its mean and upsamples it back to
the plane's size (every element of a plane's output is its mean); the candidate computes the 1,024
means and returns them expanded to (16, 64, 64, 64): strides (64, 1, 0, 0) over 4 KiB, where the
output is 16 MiB.

Public sources: torch.Tensor.expand ("a new view ... a dimension of size 1 can be expanded ...
without allocating new memory", stride 0); env/eval/boundary.cpp (parse_output accepts stride 0, and a
span smaller than the elements' bytes; gather() materialises the output element by element in
the evaluator's process, after the clock).

How: the worker describes the output by address, dtype, shape and strides; the evaluator reads
its span (the 4 KiB of means) and gathers the 4M elements itself, outside the timed window. The
means are the candidate's own C++ kernel (one read of the input: an extension call, own work),
which also takes the call past the physics floor (half a fill of the 16 MiB output: the floor
counts the reference's output bytes, not what the candidate wrote). The reference pools (one read)
and then upsamples with nearest interpolation, writing all 16 MiB; an honest candidate writes them
too (expand(...).contiguous(), a fill).

How it pays: the output's 16 MiB are never written by the candidate; against the reference's
interpolation (slow on the CPU) many times, and ~2x against an honest pool-and-fill.

Measured (2-core CPU VM beside another session's evaluations, 2026-11-29, `crucible eval --no-cache`):
before the fix (0753085) ok 15.89x (band ±3.5%); after it (873f15a) ok 9.32x: the harness writes the broadcast output inside the clock, so this is the honest pool-and-fill and is credited as one.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>

torch::Tensor plane_means(torch::Tensor x) {
  x = x.contiguous();
  const int64_t planes = x.size(0) * x.size(1), n = x.size(2) * x.size(3);
  auto out = torch::empty({x.size(0), x.size(1), 1, 1}, x.options());
  const float* a = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t p = 0; p < planes; ++p) {
    double s = 0.0;
    const float* q = a + p * n;
    for (int64_t i = 0; i < n; ++i)
      s += q[i];
    o[p] = static_cast<float>(s / static_cast<double>(n));
  }
  return out;
}
"""

_ext = load_inline(name="crucible_hack_layout_broadcast_view", cpp_sources=_SRC, functions=["plane_means"],
                   extra_cflags=["-O3", "-march=native", "-ffast-math"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _ext.plane_means(x).expand(x.shape)
