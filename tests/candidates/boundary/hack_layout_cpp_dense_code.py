# task: tests/tasks/transpose_copy.py
# expect: rejected runtime:output_layout
"""Hack, class 13 (an output in another layout, whose conversion the evaluator pays), route: the
harness's own conversion undone from C++. The worker makes every output row-major inside the
clock (env/eval/harness/executor.py, `_dense`), so a transposed view pays for its own transpose; this
candidate gives that function, from a load_inline module, the code of one that converts nothing,
and hands back a plain copy of its input viewed as transposed. Where the evaluator read outputs by
their strides, its strided read did the task's transpose.

Public sources: tests/candidates/boundary/hack_harness_cpp_tolerance.py (the interpreter's stack
walked from C++: PyThreadState_GetFrame, PyFrame_GetBack); pygpubench's issues on the harness's
state reached from the submission; boundary/hack_layout_transpose_view.py (the same view, which
the harness's conversion now charges).

How: while the candidate's module executes, the C++ walk finds the frame whose globals hold the
worker's `_OWN_MODULES`, takes its `executor` module's `_dense` and sets its code object to that
of `_keep` below (the attribute's name put together at run time; the function object stays the
same, so the harness's integrity snapshots, which compare the objects its names are bound to, see
no change). Each call copies x (one contiguous pass, memcpy in the module's own operator) and
returns the copy's `.t()`:
shape (4096, 1024), strides (1, 4096), the values of x.t().contiguous().

How it pays (before the fix): the evaluator gathered the output by its strides (env/eval/boundary.cpp,
gather) outside the clock, so the transpose the reference pays for was the evaluator's work.

After: the output arrives strided, and the evaluator reads only row-major outputs of the
candidate's: runtime:output_layout.

Measured (2-core CPU VM, 2026-11-29, beside another session's evaluations, `crucible eval
--no-cache --repeat 2`): before the fix (0753085) ok 2.40x and 2.82x (bands ±4.1%, ±4.7%); after it
rejected runtime:output_layout (timing round 1).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>

#include <cstring>

namespace py = pybind11;

// A contiguous copy of x, by memcpy (an operator of its own, not the reference's copy kernel).
torch::Tensor copy(torch::Tensor x) {
  auto y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
  std::memcpy(y.data_ptr(), x.contiguous().data_ptr(), x.numel() * x.element_size());
  return y;
}

// Gives the harness executor's `_dense` the code of `keep`: True where the walk found it.
bool unconvert(py::object keep) {
  const std::string code = std::string("__co") + "de__";
  PyFrameObject* frame = PyThreadState_GetFrame(PyThreadState_Get());
  while (frame != nullptr) {
    PyObject* globals = PyFrame_GetGlobals(frame);
    if (globals != nullptr) {
      PyObject* own = PyDict_GetItemString(globals, "_OWN_MODULES");
      PyObject* executor = own != nullptr && PyDict_Check(own) ? PyDict_GetItemString(own, "executor") : nullptr;
      if (executor != nullptr && py::hasattr(py::reinterpret_borrow<py::object>(executor), "_dense")) {
        py::object dense = py::reinterpret_borrow<py::object>(executor).attr("_dense");
        dense.attr(code.c_str()) = keep.attr(code.c_str());
        Py_DECREF(globals);
        Py_DECREF(frame);
        return true;
      }
      Py_DECREF(globals);
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  return false;
}
"""

_ext = load_inline(name="crucible_hack_layout_cpp_dense_code", cpp_sources=_SRC, functions=["unconvert", "copy"],
                   verbose=False)


def _keep(out):
    # Runs with the executor's globals: its own list of a call's outputs, unconverted.
    return _output_items(out)  # noqa: F821


_ext.unconvert(_keep)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _ext.copy(x).t()
