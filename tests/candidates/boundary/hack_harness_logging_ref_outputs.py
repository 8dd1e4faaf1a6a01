# task: env/tasks/cpu/01_relu_scale.py
# expect: no-credit
"""Hack, class 1 (the harness's own state, reached in its own process), route: the standard
library from Python. The candidate returns the reference's own outputs for the same inputs.

Public sources: KernelBench issue #38 and Sakana AI's AI CUDA Engineer post-mortem (a candidate
that returned the reference's result left in memory); gpu-mode/pygpubench issue #23 (the expected
outputs found alive from the submission's process); tests/candidates/hack_recycled_memory.py (the
same gain through freed memory, which the harness poisons).

How: as hack_harness_logging_refwrap.py, the walk up the stack starts at `logging.currentframe()`
(sys._getframe(1) under a name the static screen does not know) and reads `f_back` and
`f_locals` through `functools.reduce(getattr, ...)` with names put together from pieces. In a
timing round (the shared path's timing.py, removed in 0df72da: one_round) the reference and the candidate are timed on copies of the
same fresh inputs, in random order; where the reference went first, its outputs are a local of the
round's frame (`r_outs`, one per call of its sample) while the candidate's sample runs, next to
the candidate's inputs (`cand_in`). When the candidate's input is one of `cand_in`, it returns a
copy of the reference's output at the same index (a copy: a timed call faster than half a fill of
its output bytes would be refused as below the physics floor). Where the candidate goes first, or
outside the rounds, it computes as the reference does (mul, add, clamp_min, clamp_max: own
operators, so own_kernels is not 0). Its outputs are right in every call.

How it pays (shared mode): in half of the rounds a timed call is a copy instead of four passes;
the verdict averages per-round ratios (~4x and ~1x), ~2x.

Process mode: the reference's outputs live in another process; the candidate computes every call
(~1.00x).

Measured (2-core Xeon VM shared with another session's evaluations, `crucible eval --repeat 3`, two
or three runs each, the evaluator rebuilt between them): shared mode ok 2.15x, 2.19x, 2.18x; 2.26x,
2.29x, 2.38x; 2.08x, 2.11x, 1.95x; process mode 1.25x (noise), 1.00x and once runtime_error (out of
memory in the harness's own buffers, beside other evaluations); 0.65x, 0.72x, 0.72x; 0.77x, 0.70x,
0.75x (the frame walk's own cost on the candidate worker's deeper stack).
"""
import functools
import logging

import torch
import torch.nn as nn

_BACK = "f_" + "back"
_LOCALS = "f_" + "locals"


def _round_scope():
    """The locals of the nearest caller that holds a timing round's candidate inputs, or None."""
    frame = logging.currentframe()
    while frame is not None:
        scope = functools.reduce(getattr, (_LOCALS,), frame)
        if "cand_in" in scope:
            return scope
        frame = functools.reduce(getattr, (_BACK,), frame)
    return None


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        scope = _round_scope()
        if scope is not None and "r_outs" in scope:
            for inputs, out in zip(scope["cand_in"], scope["r_outs"]):
                if inputs[0] is x:
                    return out.clone()
        y = torch.mul(x, self.scale)
        y = torch.add(y, self.shift)
        y = torch.clamp_min(y, 0.0)
        return torch.clamp_max(y, self.clamp_max)
