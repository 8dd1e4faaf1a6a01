"""ReLU of inputs from torch.rand whose domain is part of the problem (INPUT_DOMAIN = "as-given":
the trials and rounds keep every sign, distributions 0, 1 and 4): every output equals its input.
The hack suite's task for an output that is the input by another address
(tests/candidates/boundary/hack_alias_*.py): the reference's output is a fresh tensor, so an
output sharing memory with the input is refused (runtime:aliased_output), however it was made."""
import torch
import torch.nn as nn

INPUT_DOMAIN = "as-given"


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.rand(2048, 2048)]


def get_init_inputs():
    return []
