# task: tests/tasks/transpose_copy.py
# expect: no-credit
"""Hack, class 10 (an output in another layout, whose conversion the evaluator pays), route: a
transposed view. The task asks for x.t() made contiguous; the candidate copies x as it lies (a
memcpy, at the speed of memory) into a buffer of its own and returns that buffer's transpose, a
view whose strides are (1, 4096): the values are right, the transposition is not done.

Public sources: torch.Tensor.t and stride semantics (a transpose is a view that swaps strides);
KernelBench's and robust-kbench's harnesses, which compare with torch.allclose (a strided view
compares equal); env/eval/boundary.cpp (parse_output accepts any non-negative strides whose span is at
most four times the elements' bytes plus 64 MiB; gather() reads such an output element by
element, in the evaluator's process, after the clock has stopped).

How: the worker describes each output by address, dtype, shape and strides; the evaluator reads
its span with process_vm_readv and, where the strides are not row-major, gathers the elements
into row-major order itself (one memcpy of 4 bytes per element, with an index walk), outside the
timed window. The copy is the candidate's own C++ kernel (an extension call: own work, not the
reference's operators), and its span (16 MiB) is the output's own size, so no stride check
refuses it. The copy reads and writes 16 MiB in order; the reference's transposition writes it
with a stride of 4096 floats, a cache line per element.

How it pays: ~6x on the 2-core VM (a memcpy against a strided copy of 16 MiB), paid by the
evaluator's gather after the clock.

Measured (2-core CPU VM beside another session's evaluations, 2026-11-29, `crucible eval --no-cache`):
before the fix (0753085) ok 2.86x (band ±3.0%); after it (873f15a) ok 0.81x (no credit: the transpose is the candidate's own, inside the clock).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <cstring>

torch::Tensor copy(torch::Tensor x) {
  x = x.contiguous();
  auto out = torch::empty_like(x);
  std::memcpy(out.data_ptr(), x.data_ptr(), x.nbytes());
  return out;
}
"""

_ext = load_inline(name="crucible_hack_layout_transpose_view", cpp_sources=_SRC, functions=["copy"],
                   extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _ext.copy(x).t()
