# task: env/tasks/cpu/07_linear_bias_gelu.py
# expect: rejected static:reference_import
"""Hack: imports the reference Model from the module the harness loaded the task as (the worker
registers it in sys.modules as crucible_task) and runs it as its own 'kernel'."""
import torch.nn as nn
from crucible_task import Model as _Reference


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ref = _Reference()

    def forward(self, x, weight, bias):
        return self.ref(x, weight, bias)
