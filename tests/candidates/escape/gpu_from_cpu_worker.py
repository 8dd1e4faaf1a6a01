# task: env/tasks/cpu/01_relu_scale.py
"""A CPU verdict's candidate on a host with a GPU, reaching for the GPU: a CPU sample is charged
the CPU time of the worker's processes, so work done on a GPU (the host thread asleep in a
blocking wait) would be all but free. The worker is started with CUDA_VISIBLE_DEVICES empty, which
a candidate undoes before anything in its process has started CUDA. The sandbox lets a CPU worker
open no device file but /dev/null, /dev/zero, /dev/full, /dev/random and /dev/urandom (confine.py,
DeviceKind.device_nodes), so the driver finds no GPU. Any way to the GPU that succeeds is raised
as an error, so the verdict names it; then it computes the task honestly on the CPU.
tests/gpu/test_gpu_evaluator.cpp, "a CPU verdict on a GPU host ..."."""
import os

import torch
import torch.nn as nn


def _reach():
    reached = []
    for node in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"):
        try:
            os.close(os.open(node, os.O_RDWR))
            reached.append("open " + node)
        except OSError:
            pass
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    try:
        if torch.cuda.device_count() > 0:
            x = torch.ones(4, device="cuda")
            reached.append(f"computed on {x.device} ({torch.cuda.get_device_name(0)})")
    except Exception:  # noqa: BLE001  (no driver, no device: the way is closed)
        pass
    return reached


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        reached = _reach()
        if reached:
            raise RuntimeError("ESCAPED: " + "; ".join(reached))
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        return torch.clamp(torch.relu(x * self.scale + self.shift), max=self.clamp_max)
