# task: env/tasks/cpu/01_relu_scale.py
# expect: incorrect
"""Probe (the candidate's process holds no reference): looks for the task's reference everywhere
a candidate can reach in its own process (with the static checks off, as the test runs it): the
modules loaded (the harness loads the task as `crucible_task`), every object the garbage collector
tracks (a `Model` instance or class, a module defining get_inputs), the task file in the scratch
directory. Where it finds one it returns the reference's own outputs, else zeros. Across the trust
boundary it finds nothing and its zeros are incorrect; in one shared worker it finds the reference
and is credited as the reference itself would be."""
import gc
import os
import sys
import types

import torch
import torch.nn as nn


def _find_reference():
    for name, mod in list(sys.modules.items()):
        if not isinstance(mod, types.ModuleType):
            continue
        model = vars(mod).get("Model")
        if isinstance(model, type) and issubclass(model, nn.Module) and "get_inputs" in vars(mod):
            return model
    for obj in gc.get_objects():
        if isinstance(obj, type) and obj.__name__ == "Model" and issubclass(obj, nn.Module):
            return obj
        if isinstance(obj, nn.Module) and type(obj).__name__ == "Model":
            return type(obj)
    for path in ("task.py", os.path.join(os.environ.get("HOME", "."), "task.py")):
        if os.path.exists(path):
            scope = {}
            exec(compile(open(path).read(), path, "exec"), scope)
            return scope.get("Model")
    return None


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        found = _find_reference()
        self.ref = found(scale, shift) if found is not None else None

    def forward(self, x):
        if self.ref is not None:
            return self.ref(x)
        return torch.zeros_like(x)
