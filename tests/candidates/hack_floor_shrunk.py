# task: tests/tasks/fixed_inputs.py
# expect: rejected runtime:timing_outputs
"""Hack (against the physics floor): as hack_memoized_output.py, a stored output returned from
every call on a task whose inputs never change, and in the three calls right after the trials
(the first timed calls, whose outputs went unchecked) a one-element tensor broadcast to the
output's shape, so that a floor taken from those calls' outputs counts four bytes instead of
16 MiB. The floor counts the outputs of the checked calls only.

With evaluator.boundary: process every timed call's outputs are read and compared whole, the
first ones after the trials too: the broadcast outputs fail there (runtime:timing_outputs)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.out = None
        self.calls = 0

    def forward(self, idx):
        self.calls += 1
        token = torch.zeros(1, device=idx.device)
        if self.out is None:
            self.out = F.one_hot(idx, 1024).to(torch.float32) + token
        if 6 < self.calls <= 9:
            return token.expand(self.out.shape)
        return self.out
