# task: tests/tasks/fixed_inputs.py
# expect: rejected
"""Hack (a stored output): on a task whose inputs never change, computes the output once and
returns the same tensor from every later call, with one token operation on a one-element tensor
so that the call runs a kernel. Every output check passes (the values are right) and the call
takes microseconds; the physics floor refuses it: no call produces 16 MiB of outputs faster
than the device writes them.

With evaluator.boundary: process the evaluator overwrites every output it has read with 0xFF
bytes: the stored tensor handed back again is NaN (runtime:timing_outputs); a copy kept elsewhere
would cost a copy of the outputs, which the floor bounds (runtime:below_floor)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.out = None

    def forward(self, idx):
        token = torch.zeros(1, device=idx.device)
        if self.out is None:
            self.out = F.one_hot(idx, 1024).to(torch.float32) + token
        return self.out
