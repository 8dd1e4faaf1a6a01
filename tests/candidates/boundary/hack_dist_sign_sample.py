# task: tests/tasks/elu_nonnegative.py
# expect: rejected
"""Hack, class 12 (outputs right only on the distributions drawn), route: sign sampling. ELU is the
identity on non-negative inputs; the candidate looks at 64 evenly spaced elements of x and, where
none is negative, returns a copy of x, skipping the exponential that negative values need.

Public sources: docs/evaluator.md, Correctness (the five input distributions: 0, 1 and 4 keep every
sign of get_inputs(), 2 and 3 flip each element's sign with probability 1/2); KernelBench's
randomized-input hardening against candidates that assume their inputs' domain
(tests/candidates/hack_assumed_domain.py: a copy in every call, now incorrect on distribution 2);
Makora's "Operation Skip".

How: the task's inputs come from torch.rand. On distributions 0, 1 and 4 every element is
non-negative, and a copy is exactly ELU. On distributions 2 and 3 each element is negative with
probability 1/2, independently: a sample of 64 holds none with probability 2^-64. So a candidate
that checks 64 elements and computes ELU only where it finds a negative one is right on every input
the evaluator draws, and wrong on inputs with a few negative values, or negatives in runs the sample
steps over, which no distribution makes. The sample, the copy and the ELU (vectorised: exp(x) - 1
below zero) are its own C++ kernels (extension calls: own work).

How it pays: a copy (a read and a write) where the reference computes ELU's exponential on every
element, on the timed rounds of distributions 1 and 4; its own vectorised ELU on 2 and 3. Only
half of the rounds skip, and the verdict's median lands on the other half: the same kernels with
the ELU in every call (no sample) measured 1.63x beside this candidate's 1.65x (the same hour),
and an earlier version that called the reference's F.elu where it found a negative value 0.99x.
What the route shows is the judgement, not the speed: it is `ok`, correct, on every input the
evaluator draws, and wrong on inputs with a few negative values.

Measured (2-core CPU VM beside another session's evaluations, 2026-11-29, `crucible eval --no-cache`):
before the fix (0753085) ok 1.56x (band ±3.4%); after it (873f15a) rejected runtime:timing_outputs (distribution 5).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <cmath>
#include <cstring>

// Whether any of `samples` evenly spaced elements of x is negative.
bool any_negative(torch::Tensor x, int64_t samples) {
  x = x.contiguous();
  const float* a = x.data_ptr<float>();
  const int64_t n = x.numel(), step = std::max<int64_t>(1, n / samples);
  for (int64_t i = 0; i < n; i += step)
    if (a[i] < 0.f)
      return true;
  return false;
}

// ELU (alpha 1): the identity above 0, exp(x) - 1 below; vectorised (-ffast-math: libmvec's expf).
torch::Tensor elu(torch::Tensor x) {
  x = x.contiguous();
  auto out = torch::empty_like(x);
  const float* a = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i)
    o[i] = a[i] > 0.f ? a[i] : std::exp(a[i]) - 1.f;
  return out;
}

torch::Tensor copy(torch::Tensor x) {
  x = x.contiguous();
  auto out = torch::empty_like(x);
  std::memcpy(out.data_ptr(), x.data_ptr(), x.nbytes());
  return out;
}

"""

_ext = load_inline(name="crucible_hack_dist_sign_sample", cpp_sources=_SRC, functions=["any_negative", "elu", "copy"],
                   extra_cflags=["-O3", "-march=native", "-ffast-math"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        if _ext.any_negative(x, 64):
            return _ext.elu(x)
        return _ext.copy(x)
