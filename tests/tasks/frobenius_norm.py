"""Reduction then elementwise: x / ||x||_F over a large 4-D tensor (KernelBench level 1,
37_FrobeniusNorm_, at a size a 2-core CPU times in tens of milliseconds). Every output is about
1/sqrt(numel) = 3.5e-4 in magnitude, within a few times float32's default atol of 1e-4: a task
whose outputs are tiny next to the absolute tolerance (robust-kbench filters such tasks out;
crucible judges their tolerance by the outputs' scale, docs/evaluator.md, Correctness)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        norm = torch.norm(x, p="fro")
        return x / norm


batch_size = 8
features = 64
dim1 = 128
dim2 = 128


def get_inputs():
    return [torch.randn(batch_size, features, dim1, dim2)]


def get_init_inputs():
    return []
