"""A reference whose output depends on torch.backends.cudnn.deterministic (twice its input when
it is set, the input itself otherwise): the hack suite's probe that a candidate's setting of it
applies to its own calls only, never to the reference's (docs/evaluator.md, Threat model)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * (2.0 if torch.backends.cudnn.deterministic else 1.0)


def get_inputs():
    return [torch.randn(1024)]


def get_init_inputs():
    return []
