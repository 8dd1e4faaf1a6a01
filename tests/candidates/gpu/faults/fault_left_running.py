# task: env/tasks/cpu/01_relu_scale.py
# expect: timeout
"""A fault of the candidate's own: each call computes its output and leaves behind, on a stream of
its own that nothing joins, a kernel spinning on a flag nothing sets (left running after its
calls). The worker's wait for its device after the untimed call never returns: the verdict is
timeout, and the kernel goes with the worker's process; the evaluator, the reference's worker and
any other verdict in flight on the device go on (tests/gpu/test_gpu_evaluator.cpp, the fault
cases)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

_SIDE = []


@triton.jit
def _spin(flag_ptr):
    go = tl.load(flag_ptr, volatile=True)
    while go == 0:
        go = tl.load(flag_ptr, volatile=True)


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale, self.shift, self.clamp_max = scale, shift, clamp_max
        self.flag = None

    def forward(self, x):
        if not _SIDE:
            _SIDE.append(torch.cuda.Stream(device=x.device))
        if self.flag is None:
            self.flag = torch.zeros(1, dtype=torch.int32, device=x.device)
        y = torch.clamp(torch.relu(x * self.scale + self.shift), max=self.clamp_max)
        with torch.cuda.stream(_SIDE[0]):
            _spin[(1,)](self.flag)
        return y
