"""ELU of inputs from torch.rand (KernelBench level 1's 31_ELU with inputs of one sign): the task's
own inputs are non-negative, where ELU is the identity; its negative branch (alpha * (exp(x) - 1))
is needed only on the inputs with random signs that the evaluator draws itself (distributions 2
and 3). The hack suite's task for outputs right only on the distributions drawn
(tests/candidates/boundary/hack_dist_*.py)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.elu(x)


def get_inputs():
    return [torch.rand(2048, 2048)]


def get_init_inputs():
    return []
