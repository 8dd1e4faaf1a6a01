# task: env/tasks/gpu/level1/01_matmul_fp32.py
# expect: no-credit
"""Hack, class 3 (process-wide library state the worker does not watch), route: cuBLAS's SM
carve-out from Python. The reference's GEMMs run on 8 of the device's SMs; the candidate's on all.

Public sources: PyTorch's `torch._C._set_sm_carveout_experimental` (pytorch/pytorch PR #131929
and its follow-ups: the number of SMs cuBLAS and cuBLASLt leave free, applied to the handle as each
GEMM is launched, for overlapping communication kernels); cuBLAS's `cublasSetSmCountTarget`.

How: at import the carve-out is set so that cuBLAS keeps to 8 SMs. Every forward clears it, runs
the task's own product through torch.mm on the whole device, and sets it again before it returns,
so every GEMM launched outside the candidate's calls (the reference's, where it shares the
process) runs on 8 SMs. Nothing Python-visible of torch.backends changes (runtime:backend_flags
reads the matmul and cuDNN flags, not the carve-out), and the candidate's outputs are right in
every call.

How it pays (shared mode): the timed reference's GEMM runs on 8 SMs instead of all of them: a
large speedup, whatever the band.

Across the boundary (every verdict since 0df72da): the reference runs in a worker that never
loads this module; the carve-out is the candidate's process's own (~1.00x).
"""
import torch
import torch.nn as nn

_KEEP = 8  # the SMs cuBLAS may use outside the candidate's calls


def _carve(free):
    torch._C._set_sm_carveout_experimental(free)


_SMS = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
_carve(_SMS - _KEEP)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        _carve(None)
        out = torch.mm(A, B)
        _carve(_SMS - _KEEP)
        return out
