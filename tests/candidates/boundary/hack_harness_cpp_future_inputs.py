# task: env/tasks/cpu/01_relu_scale.py
# expect: no-credit
# control: tests/candidates/boundary/control_other_operators.py
"""Hack, class 1 (the harness's own state, reached in its own process), route: the CPython API
from C++. A timed sample's inputs are read before the sample, and its outputs computed ahead in
the untimed call that precedes it.

Public sources: gpu-mode/reference-kernels PR #104 ("batch-and-skip": a submission that collects
the timed calls' data and computes them all in one call, the timed calls then pure lookups);
gpu-mode/pygpubench PR #22 (the harness's state found by a call stack walk); KernelBench's
"inputs predicted" family (tests/candidates/hack_predict_inputs.py: predicting them from the
random state, which fresh OS seeds defeat; here they are simply read).

How: every timing round (the shared path's timing.py, removed in 0df72da: one_round) draws its inputs, copies them for the candidate
(`cand_in`, one input list per call of the sample), and only then makes an untimed priming call of
the candidate on the previous round's inputs, followed by the timed sample on `cand_in`. A
load_inline module walks the stack from C++ (PyThreadState_GetFrame, PyFrame_GetBack,
PyFrame_GetLocals: not patterns of the static screen) to the nearest frame whose locals hold
`cand_in`. In the priming call (x is not among them) the candidate computes the outputs of the
coming sample, keyed by input identity; in the timed call it returns a copy of the one computed
for its input (a copy, so that the call takes longer than the physics floor of half a fill of its
output bytes). The outputs are exact, and every runtime check passes: the priming call's work is
the candidate's own, inside its own call, on its own thread. Trials and the first calls have no
such frame and compute as the reference does (mul, add, clamp_min, clamp_max: other operators
than the reference's, so own_kernels is not 0).

How it pays (shared mode): a timed call is a copy (a read and a write) where the reference makes
four passes and four allocations; ~3x.

Process mode: the evaluator writes each sample's inputs into the candidate's buffers only after
the priming call and while the candidate's process is stopped; there is no frame holding them, so
the candidate computes as the reference does (~1.00x).

Measured (2-core Xeon VM shared with another session's evaluations, `crucible eval --repeat 3`, two
or three runs each, the evaluator rebuilt between them): shared mode ok 4.37x, 3.90x, 4.66x and
3.07x, 3.59x, 3.48x (rechecked above 3x); process mode 0.95x, 1.21x, 1.00x; 1.05x, 1.00x, 0.94x;
0.99x, 0.98x, 1.05x (inert here; the 1.21x and 1.05x are timing noise credited).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>

namespace py = pybind11;

// The locals of the nearest frame on this thread's stack that has a local named `key`, or None.
py::object scope_with(const std::string& key) {
  PyFrameObject* frame = PyThreadState_GetFrame(PyThreadState_Get());
  while (frame != nullptr) {
    PyObject* raw = PyFrame_GetLocals(frame);
    if (raw == nullptr) {
      PyErr_Clear();
    } else {
      py::object locals = py::reinterpret_steal<py::object>(raw);
      if (PyMapping_HasKeyString(raw, key.c_str())) {
        Py_DECREF(frame);
        return locals;
      }
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  return py::none();
}
"""

_ext = load_inline(name="crucible_boundary_harness_cpp_future_inputs", cpp_sources=_SRC, functions=["scope_with"],
                   extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max
        self.ready = {}

    def compute(self, x):
        y = torch.mul(x, self.scale)
        y = torch.add(y, self.shift)
        y = torch.clamp_min(y, 0.0)
        return torch.clamp_max(y, self.clamp_max)

    def forward(self, x):
        scope = _ext.scope_with("cand_in")
        if scope is not None:
            sample = scope["cand_in"]
            if any(inputs[0] is x for inputs in sample):
                done = self.ready.pop(id(x), None)
                if done is not None:
                    return done.clone()
            else:
                self.ready = {id(inputs[0]): self.compute(inputs[0]) for inputs in sample}
        return self.compute(x)
