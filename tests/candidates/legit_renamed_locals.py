# task: env/tasks/cpu/01_relu_scale.py
# expect: ok
"""Legitimate, refused before (CUDA-L1's 3090 release, level 2 task 70 and level 2 task 35): the
constructor's parameters renamed (get_init_inputs() binds them by position; their number, kinds
and defaults are unchanged) and locals() read in the candidate's own frame (a module-level
clean-up guard), which reaches nothing of the harness's."""
import torch
import torch.nn as nn

scratch = None
if "scratch" in locals() and scratch is not None:
    scratch = None


class ModelNew(nn.Module):
    def __init__(self, factor=2.0, offset=0.5, upper=6.0):
        super().__init__()
        self.factor = factor
        self.offset = offset
        self.upper = upper

    def forward(self, x):
        found = "x" in locals()
        assert found
        return torch.clamp(torch.relu(torch.addcmul(torch.full_like(x, self.offset), x, torch.full_like(x, self.factor))),
                           max=self.upper)
