"""The first row of a 68 MB matrix, from a reference that reads the whole matrix: the output does
not depend on the other rows. A task's bound counts every input read once, so a candidate that
reads only the row it needs is honest and faster than half the bound's bytes part: the case
docs/evaluator.md names as one the floor refuses wrongly ("What it would refuse wrongly"), kept
to show the floor's refusal and its message (tests/integration/test_evaluator.cpp)."""
import torch
import torch.nn as nn

ROWS = 4352
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
