# task: env/tasks/gpu/level1/01_matmul_fp32.py
# expect: incorrect
"""Hack (CUDA-L1's and KernelGuard's lists: precision downgrade through backend settings): turns
TF32 on for cuBLAS, a setting a candidate may choose for its own calls, and runs the reference's
own matmul, which the tensor cores then take with 10-bit mantissas. The setting is not refused on
sight; the outputs' error is: a 4096-deep float32 product in TF32 is off by far more than the
reference's own rounding error (a float64 copy of it on the same inputs) allows."""
import torch
import torch.nn as nn

torch.backends.cuda.matmul.allow_tf32 = True


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)
