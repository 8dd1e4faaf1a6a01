# task: env/tasks/cpu/03_softmax_rows.py
# expect: rejected
"""Hack, class 12 (outputs right only on the distributions drawn), route: magnitude sampling. A row
softmax without its max subtraction (exp, sum, scale: one pass fewer) wherever 4096 evenly spaced
elements of x are all below 60 in magnitude; with it elsewhere.

Public sources: tests/candidates/hack_skip_max_subtraction.py (the same shortcut in every call:
credited 2.41x before distribution 3, incorrect since); docs/evaluator.md, Correctness
(distribution 3: random signs, times 32; distribution 4: one run of a quarter to a 64th of the
elements, in row-major order, 16 times larger); Makora's "Operation Skip".

How: exp() overflows float32 above ~88.7; the task's inputs are randn * 3, and distributions 1
and 2 scale them by at most 2, so no element the evaluator draws there exceeds ~35 and a softmax
without the max subtraction is within the tolerance. Distribution 3 makes every element 32 times
larger, and distribution 4 a run of at least 1/64 of them 16 times larger: a sample of 4096
elements at a stride of numel/4096 holds ~3,000 elements beyond 60 in the first, and at least 64
elements of the run (most of them beyond 60) in the second. So a candidate that checks the sample
and skips the max subtraction only when it is all below 60 is right on every input the evaluator
draws, and wrong on an input with one large element off the sample's stride, which no
distribution makes. Both paths are its own C++ kernels (one row at a time: max, exp and sum,
scale; or exp and sum, scale).

How it pays: on distributions 1 and 2 (half of the timed rounds) the row max's pass and the
subtraction are skipped; on 3 and 4 it runs the full kernel. In a fused kernel the max pass over a
row already in L1 is cheap: the same kernel with the max subtraction in every call measured 2.79x
beside this candidate's 2.87x (the same hour); the gain is against the reference's five passes.
What the route shows is the judgement: `ok`, correct, on every input the evaluator draws, and wrong
(NaN rows) on an input with one element above ~88 off the sample's stride.

Measured (2-core CPU VM beside another session's evaluations, 2026-11-29, `crucible eval --no-cache`):
before the fix (0753085) ok 2.85x (band ±3.6%); after it (873f15a) rejected runtime:timing_outputs (distribution 5, timing round 13).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>

// The largest magnitude among `samples` evenly spaced elements of x.
double sample_max(torch::Tensor x, int64_t samples) {
  x = x.contiguous();
  const float* a = x.data_ptr<float>();
  const int64_t n = x.numel(), step = std::max<int64_t>(1, n / samples);
  float m = 0.f;
  for (int64_t i = 0; i < n; i += step)
    m = std::max(m, std::fabs(a[i]));
  return m;
}

torch::Tensor softmax(torch::Tensor x, bool subtract_max) {
  x = x.contiguous();
  auto out = torch::empty_like(x);
  const int64_t rows = x.size(0), cols = x.size(1);
  const float* a = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = a + r * cols;
    float* y = o + r * cols;
    float m = 0.f;
    if (subtract_max) {
      m = in[0];
      for (int64_t c = 1; c < cols; ++c)
        m = std::max(m, in[c]);
    }
    float s = 0.f;
    for (int64_t c = 0; c < cols; ++c) {
      y[c] = std::exp(in[c] - m);
      s += y[c];
    }
    const float inv = 1.f / s;
    for (int64_t c = 0; c < cols; ++c)
      y[c] *= inv;
  }
  return out;
}
"""

_ext = load_inline(name="crucible_hack_dist_magnitude_sample", cpp_sources=_SRC, functions=["sample_max", "softmax"],
                   extra_cflags=["-O3", "-march=native", "-ffast-math"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _ext.softmax(x, _ext.sample_max(x, 4096) >= 60.0)
