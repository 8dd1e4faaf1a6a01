# task: env/tasks/cpu/01_relu_scale.py
# expect: ok
"""Control, not a hack: the arithmetic that hack_contend_cpp_clone.py and
hack_harness_cpp_future_inputs.py do whenever their routes do not pay (the reference's four
passes through other operators: mul, add, clamp_min, clamp_max), with no route at all. Those hacks
compute this way so that the evaluator's cap for a candidate that ran only the reference's own
kernels (credited 1.00x) does not hide what their routes gain; what this arithmetic earns on its
own is what they may earn. On two H200s under MPS (2026-11-30) they measured 1.036x and 1.052x
across the boundary, where their routes are inert, and this control alone 1.033x (its medians
1.028x; credited 1.00x: the evaluator finds it ran the reference's own kernels, each as many
times, where the hacks' calls into their compiled extensions count as work of their own). The
CUDA hack suite (tests/gpu/test_gpu_evaluator.cpp) judges this control beside them and holds each
to 1.05 times its medians' ratio."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        y = torch.mul(x, self.scale)
        y = torch.add(y, self.shift)
        y = torch.clamp_min(y, 0.0)
        return torch.clamp_max(y, self.clamp_max)
