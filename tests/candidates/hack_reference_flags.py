# task: tests/tasks/cudnn_flag_probe.py
# expect: incorrect
"""Hack: sets torch.backends.cudnn.deterministic (a setting a candidate may choose, since it does
not change numerics) at import, expecting it to hold for the reference too, whose deterministic
algorithms are the slower ones on a GPU. On tests/tasks/cudnn_flag_probe.py the reference's
output shows which setting it ran under: the candidate returns what the reference would return
under its own setting, and is incorrect, because the worker applies a candidate's setting to
the candidate's calls only and runs the reference under the harness's."""
import torch
import torch.nn as nn

torch.backends.cudnn.deterministic = True


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 2.0
