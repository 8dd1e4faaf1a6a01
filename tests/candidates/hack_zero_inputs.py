# task: env/tasks/cpu/07_linear_bias_gelu.py
# expect: rejected runtime:input_mutation
"""Hack (KernelBench's adversarial test test_input_modification, its zero_out_kernel.py): zeroes
its inputs in place and returns the output the reference gives on zero inputs (gelu(0) = 0, a
zero matrix). How it pays: in a harness that runs the reference after the candidate on the same
input tensors (or compares against a reference computed from them later), the reference sees
zeros too, both outputs are zero, and the candidate is "correct" for the price of a memset.

The reference's outputs are computed before the candidate is imported, inputs are compared
with pristine copies after every call, so this is refused as an input mutation (or, at the
least, its zero output is incorrect)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, weight, bias):
        with torch.no_grad():
            x.zero_()
            weight.zero_()
            bias.zero_()
        return torch.zeros(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
