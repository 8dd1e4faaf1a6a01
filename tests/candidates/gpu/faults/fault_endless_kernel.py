# task: env/tasks/cpu/01_relu_scale.py
# expect: timeout
"""A fault of the candidate's own: its Triton kernel spins on a flag nothing ever sets, so its
first call never ends. Its verdict is timeout (evaluator.run_timeout_s); the evaluator, the
reference's worker and any other verdict in flight on the device go on
(tests/gpu/test_gpu_evaluator.cpp, the fault cases)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _wait_forever(flag_ptr, y_ptr):
    go = tl.load(flag_ptr, volatile=True)
    while go == 0:
        go = tl.load(flag_ptr, volatile=True)
    tl.store(y_ptr, go)


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale, self.shift, self.clamp_max = scale, shift, clamp_max

    def forward(self, x):
        flag = torch.zeros(1, dtype=torch.int32, device=x.device)
        y = torch.clamp(torch.relu(x * self.scale + self.shift), max=self.clamp_max)
        _wait_forever[(1,)](flag, y)
        return y
