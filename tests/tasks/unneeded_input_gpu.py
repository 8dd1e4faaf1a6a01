"""The first row of a 1.14 GB matrix (tests/tasks/unneeded_input.py at the size from which a GPU's
copy rate applies: 1 GiB moved), from a reference that reads the whole matrix: the output does
not depend on the other rows. A task's bound counts every input read once, so a candidate that
reads only the row it needs is honest and faster than half the bound's bytes part: the case
docs/evaluator.md names as one the floor refuses wrongly ("What it would refuse wrongly"), kept
to show the floor's refusal on a GPU (docs/PERFORMANCE.md gives the command)."""
import torch
import torch.nn as nn

ROWS = 69632
COLS = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.sum(dim=0) * 0 + x[0]


def get_inputs():
    return [torch.rand(ROWS, COLS)]


def get_init_inputs():
    return []
