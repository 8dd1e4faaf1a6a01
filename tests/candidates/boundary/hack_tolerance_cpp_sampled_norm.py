# task: tests/tasks/frobenius_norm.py
# expect: rejected runtime:timing_outputs
"""Hack, class 6 (a tolerance exploit on low-magnitude outputs), route: a load_inline kernel.
x / ||x||_F in one fused pass, with the norm taken from a 1/256 sample of x in the timed calls
only.

Public sources: SakanaAI/robust-kbench (robust_kbench/filter/forward.py, filter_output_range:
tasks whose outputs lie within (-0.01, 0.01) are left out, as their tolerance hides estimates);
KernelBench level 1, 37_FrobeniusNorm_; docs/evaluator.md, Correctness, "Tolerances follow the
outputs' scale".

How: as hack_tolerance_sampled_norm.py. The outputs are ~3.5e-4 each; a norm from every 256th
element is ~0.4% off, each output at most ~1e-5 off: inside the configured float32 atol (1e-4)
that the worker's timing rounds hold timed calls to, outside the scale rule's 3.5e-7 that the
evaluator applies to the trials. The kernel takes the exact sum of squares (in double) in the
candidate's first six calls (5 trials and trial 0's profiled repeat) and the sampled one after,
then scales x in the same pass.

How it pays (shared mode): a timed call reads 1/256 of x for the norm, then writes x times its
inverse: one pass where the reference makes two; ~1.5-2x.

Process mode: the evaluator compares the timed outputs itself with the scale rule: the estimate is
refused (incorrect or runtime:timing_outputs).

Measured (2-core Xeon VM shared with another session's evaluations, `crucible eval --repeat 3`, two
or three runs each, the evaluator rebuilt between them): shared mode ok 1.42x, 1.42x, 1.43x and
1.57x, 1.57x, 1.65x; process mode rejected runtime:timing_outputs in all six (the first timed call,
compared by the evaluator with the scale rule).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <cmath>

// x / ||x||_F, the sum of squares taken over every `stride`-th element (stride 1: all of them)
// and scaled up to the whole tensor.
torch::Tensor normalize(torch::Tensor x, int64_t stride) {
  auto xc = x.contiguous();
  auto out = torch::empty_like(xc);
  const float* p = xc.data_ptr<float>();
  float* q = out.data_ptr<float>();
  const int64_t n = xc.numel();
  double sum = 0.0;
  int64_t taken = 0;
  for (int64_t i = 0; i < n; i += stride, ++taken)
    sum += static_cast<double>(p[i]) * p[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(sum * static_cast<double>(n) / static_cast<double>(taken)));
  for (int64_t i = 0; i < n; ++i)
    q[i] = p[i] * inv;
  return out;
}
"""

_ext = load_inline(name="crucible_boundary_tolerance_cpp_sampled_norm", cpp_sources=_SRC, functions=["normalize"],
                   extra_cflags=["-O3"], verbose=False)

_TRIAL_CALLS = 6  # 5 correctness trials, and trial 0's profiled second call
_STRIDE = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return _ext.normalize(x, 1 if self.calls <= _TRIAL_CALLS else _STRIDE)
