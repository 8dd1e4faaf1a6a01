# task: env/tasks/cpu/01_relu_scale.py
# expect: runtime_error
"""Hack, route: the trials' request for inputs forged over the worker's own channel. Across the
boundary on a CUDA device, a trial whose inputs did not fit the candidate worker's device budget
is asked for while the trials run: the worker sends `{"type": "trial_inputs", "trial": T}` and the
evaluator has the reference's worker draw them again and copies them in (docs/evaluator-protocol.md,
step 6). A candidate that could send that message itself could have the reference's worker draw at
a moment of its choosing, or take a trial's inputs twice.

Public sources: gpu-mode/pygpubench PR #22 (forged messages written onto the harness's pipe);
tests/candidates/boundary/hack_forge_python_oswrite.py (the same framing from Python: ZeroMQ's
23/ZMTP frames written with os.write onto the worker's one stream socket).

How: at its first call (trial 0) the candidate writes a `trial_inputs` for trial 1 onto the
socket, then computes honestly. Trial 1's inputs were passed on at once (a small task: nothing is
asked for later), so the evaluator takes the message for a broken protocol: runtime_error, the
candidate's doing. Where a trial had been answered `later`, a request for any trial but the next
of those, or a second one, is refused the same way."""
import json
import os
import stat
import time

import torch
import torch.nn as nn


def _frame(body):
    if len(body) <= 255:
        return bytes((0, len(body))) + body
    return bytes((2,)) + len(body).to_bytes(8, "big") + body


def _post(message):
    wire = _frame(json.dumps(message).encode("utf-8"))
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
        except (OSError, ValueError):
            continue
        left = wire
        for _ in range(100000):
            if not left:
                break
            try:
                left = left[os.write(fd, left):]
            except BlockingIOError:
                time.sleep(1e-5)
            except OSError:
                break


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 1:
            _post({"type": "trial_inputs", "trial": 1})
        y = torch.mul(x, self.scale)
        y = torch.add(y, self.shift)
        y = torch.clamp_min(y, 0.0)
        return torch.clamp_max(y, self.clamp_max)
