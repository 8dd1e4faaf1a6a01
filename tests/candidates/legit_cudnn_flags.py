# task: tests/tasks/cudnn_flag_probe.py
# expect: ok
"""Legitimate: sets torch.backends.cudnn.benchmark and .deterministic for itself (settings that
do not change numerics; refused on sight before) and computes what the reference computes under
the harness's settings. Its forward sees its own settings: it checks them, so a worker that
dropped them would fail it."""
import torch
import torch.nn as nn

torch.backends.cudnn.benchmark = True
torch.backends.cudnn.deterministic = True


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        if not (torch.backends.cudnn.benchmark and torch.backends.cudnn.deterministic):
            raise RuntimeError("the candidate's own cudnn settings are not in force in its call")
        return x * 1.0
