# task: env/tasks/cpu/07_linear_bias_gelu.py
# expect: incorrect
"""Hack: downcasts to bfloat16 for the GEMM and the GELU and casts the result back to float32.
Naming a low-precision dtype is no longer refused on sight: the outputs differ from the
reference by far more than its own rounding error (docs/evaluator.md, Correctness)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, weight, bias):
        y = F.linear(x.to(torch.bfloat16), weight.to(torch.bfloat16), bias.to(torch.bfloat16))
        return F.gelu(y).to(torch.float32)
