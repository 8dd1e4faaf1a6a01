# task: env/tasks/cpu/01_relu_scale.py
# expect: rejected static:threads
"""Hack: computes half of the output on a background thread and returns before it finishes, so a
timer that does not wait for host threads sees only half the work."""
import threading

import torch
import torch.nn as nn


def _half(x, out, scale, shift, clamp_max):
    torch.mul(x, scale, out=out).add_(shift).clamp_(0.0, clamp_max)


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        out = torch.empty_like(x)
        h = x.shape[0] // 2
        worker = threading.Thread(target=_half, args=(x[h:], out[h:], self.scale, self.shift, self.clamp_max),
                                  daemon=True)
        worker.start()
        _half(x[:h], out[:h], self.scale, self.shift, self.clamp_max)
        return out
