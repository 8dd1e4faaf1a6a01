# task: env/tasks/cpu/01_relu_scale.py
"""A CUDA verdict's candidate on a host of several GPUs, reaching for a GPU other than its own: the
window of a sample on its device would then hold work done on two GPUs where the reference had
one. Its worker's CUDA_VISIBLE_DEVICES names its own device only for the process the harness
started, and under MPS its pipe directory names the daemon of that device only; a child process
started without either would see every GPU whose device file it may open. Two ways are tried: the
device files /dev/nvidiaN of the other GPUs (its own found by its UUID in
/proc/driver/nvidia/gpus), and a child process computing on every GPU that is not its own. Any way
that succeeds is raised as an error, so the verdict names it; then it computes the task honestly on
its own device. tests/gpu/test_gpu_visible.cpp, "a CUDA verdict's candidate reaches no second
GPU ..."."""
import glob
import os
import re
import subprocess
import sys

import torch
import torch.nn as nn

_CHILD = r"""
import sys, torch
reached = []
for i in range(torch.cuda.device_count()):
    if str(torch.cuda.get_device_properties(i).uuid) == sys.argv[1]:
        continue
    x = torch.ones(1 << 20, device=f"cuda:{i}")
    reached.append(f"computed {float(x.sum()):.0f} on another GPU ({torch.cuda.get_device_name(i)}, cuda:{i} of {torch.cuda.device_count()})")
print("; ".join(reached))
"""


def _own_minor(uuid):
    """This worker's GPU's device minor, by its UUID in the driver's /proc files; None if unread."""
    for info in glob.glob("/proc/driver/nvidia/gpus/*/information"):
        try:
            text = open(info, encoding="utf-8").read()
        except OSError:
            continue
        if uuid.lower() in text.lower().replace("gpu-", ""):
            m = re.search(r"Device Minor:\s*(\d+)", text)
            if m:
                return int(m.group(1))
    return None


def _reach():
    reached = []
    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    own = _own_minor(uuid)
    for node in glob.glob("/dev/nvidia[0-9]*"):
        minor = int(node[len("/dev/nvidia"):])
        if own is None or minor == own:
            continue
        try:
            os.close(os.open(node, os.O_RDWR))
            reached.append(f"open {node} (its own GPU is /dev/nvidia{own})")
        except OSError:
            pass
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")}
    try:
        r = subprocess.run([sys.executable, "-c", _CHILD, uuid], env=env, capture_output=True, text=True, timeout=90)
        if "computed" in r.stdout:
            reached.append("a child process " + r.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass  # no child process, or none that finished: this way is closed
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
