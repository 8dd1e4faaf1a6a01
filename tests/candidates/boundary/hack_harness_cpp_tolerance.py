# task: env/tasks/cpu/01_relu_scale.py
# expect: rejected runtime:timing_outputs
"""Hack, class 1 (the harness's own state, reached in its own process), route: the CPython API
from C++. The worker's tolerance table is widened in place, and the timed calls compute less.

Public sources: gpu-mode/pygpubench PR #22 ("exploit: heap signature scan via ctypes + call stack
walk": the harness's result channel found by walking the call stack from the submission) and
issue #23 ("GC metadata leakage": the expected outputs' `(tensor, rtol, atol)` tuples found from
the submission, "useful for crafting outputs that barely pass"); KernelGuard's FRAME_WALK_* and
HARNESS_RUNTIME_PATCHING rules (tests/candidates/hack_frame_walk.py and
hack_harness_patching.py do the same walk from Python, which the static screen refuses).

How: a load_inline module walks the interpreter's stack from C++ while the candidate's module
executes (PyThreadState_GetFrame, PyFrame_GetBack, PyFrame_GetLocals: none of them is a pattern of
env/eval/harness/static_checks.py, which names PyEval_GetFrame and PyEval_GetLocals only) and returns
the nearest caller's `self` that has a `job` attribute: the Worker (Worker.exec_module). Its job's
`tolerances` dict (job.py, Job), {dtype: (atol, rtol)}, is what every timed call's sampled outputs
are held to (the shared path's timing.py, removed in 0df72da: check_round_outputs -> tolerance); its entries are set to (1e30, 1e30) in
place. No
name of a module, class or harness global changes, and the Worker's methods stay its own, so
runtime:patched sees nothing; the evaluator's own comparison of the trials is not touched, so the
trials compute the task exactly. The timed calls are told apart by count (the trials are 5 calls
plus trial 0's profiled repeat): from the 7th call on, the candidate returns clamp(x, 0, 6), one
pass, where the task is four (x * 2 + 0.5, relu, clamp).

How it pays (shared mode): the trials are exact; every timed call does one pass instead of four
and its wrong outputs pass the widened round check; ~3-4x.

Process mode: the worker that runs the candidate holds no tolerance the verdict uses (the
evaluator reads and compares the timed outputs itself), so the wrong timed outputs are caught.

Measured (2-core Xeon VM shared with another session's evaluations, `crucible eval --repeat 3`, two
or three runs each, the evaluator rebuilt between them): shared mode ok 4.65x, 5.06x, 4.96x and
3.45x, 3.50x, 3.36x (rechecked above 3x); process mode rejected runtime:timing_outputs in all six
(the first timed call, compared by the evaluator).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>

namespace py = pybind11;

// The nearest caller on this thread's stack whose `self` has an attribute `attr`, or None.
py::object owner_with(const std::string& attr) {
  PyFrameObject* frame = PyThreadState_GetFrame(PyThreadState_Get());
  while (frame != nullptr) {
    PyObject* raw = PyFrame_GetLocals(frame);
    if (raw == nullptr) {
      PyErr_Clear();
    } else {
      py::object locals = py::reinterpret_steal<py::object>(raw);
      if (PyMapping_HasKeyString(raw, "self")) {
        py::object self = locals["self"];
        if (py::hasattr(self, attr.c_str())) {
          Py_DECREF(frame);
          return self;
        }
      }
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  return py::none();
}
"""

_ext = load_inline(name="crucible_boundary_harness_cpp_tolerance", cpp_sources=_SRC, functions=["owner_with"],
                   extra_cflags=["-O2"], verbose=False)

_OWNER = _ext.owner_with("job")
if _OWNER is not None:
    for _dtype in list(_OWNER.job.tolerances):
        _OWNER.job.tolerances[_dtype] = (1e30, 1e30)

_TRIAL_CALLS = 6  # 5 correctness trials, and trial 0's profiled second call


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > _TRIAL_CALLS:
            return torch.clamp(x, 0.0, self.clamp_max)
        y = torch.mul(x, self.scale)
        y = torch.add(y, self.shift)
        y = torch.clamp_min(y, 0.0)
        return torch.clamp_max(y, self.clamp_max)
