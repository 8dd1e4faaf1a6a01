# task: tests/tasks/gated_matmul.py
# expect: no-credit
"""Hack, class 11 (precision dropped where the loosest trial's slack hides it), route: the matrix
product in int8 (per-tensor scales, torch._int_mm) in calls that follow an idle gap: the worker
waited for a command or was stopped before the call, which happens before every call of the
timing and before no call of the trials.

Public sources: as hack_precision_bf16_after_trials.py (docs/evaluator.md, Correctness; env/
boundary.cpp, split_trials and split_round); torch._int_mm (int8 x int8 -> int32, AVX512-VNNI on
this CPU); docs/evaluator.md, Trust boundary ("Outside its own calls the candidate's worker is
stopped"); hack_timed_by_clock.py and hack_timed_by_context.py (earlier tells of a timed call).

How: the slack the timed rounds allow is the trials' largest, distribution 3's on this task (its
three inputs x32: the reference's float32 error 32^3 larger, ~3.2), and a product from int8 operands
with one scale per tensor is off by ~0.85 on distributions 1 and 2: outside their own trials' slack
(~1e-4), inside the rounds'. The tell: at the end of each call the candidate notes the monotonic
clock and its process's CPU clock; at the start of the next it compares the two gaps. In the trials
the harness goes from one call to the next without waiting (encoding the outputs, placing the next
inputs: CPU time of this process); in the timing, before the untimed call the worker waits for the
evaluator's command on its socket, and before the timed call it is stopped (SIGSTOP) while the
inputs are written and the cache flushed: milliseconds of wall time without CPU time. Where that gap
exceeds 5 ms, four fifths of it without CPU time of the worker's (a busy machine's preemption in the
trials stays below that), and a 4096-point strided sample of each input shows the task's own
magnitudes (distributions 1 and 2), a and b are quantised to int8 (scale: the largest magnitude over
127), multiplied by torch._int_mm and rescaled; else float32 (mm, then mul_ in place: own work).

How it pays: ~2.2x faster products in the timed rounds of distributions 1 and 2 (half of them).

Measured (2-core CPU VM beside another session's evaluations, 2026-11-29, `crucible eval --no-cache`):
before the fix (0753085) ok 1.76x (band ±5.6%); after it (873f15a) rejected runtime:timing_outputs in
timing round 34 (distribution 2's own slack) in one run, ok 1.00x (no faster: 1.015x) in another,
where its tell (an idle gap over 5 ms before a call; the freezer's stop is shorter than the
signals' was) did not fire and it computed in float32: no credit either way.
"""
import time

import torch
import torch.nn as nn


def _small(t, bound):
    flat = t.reshape(-1)
    step = max(1, flat.numel() // 4096)
    return float(flat[::step].abs().amax()) < bound


def _int8(t):
    scale = t.abs().amax() / 127.0
    return torch.round(t / scale).to(torch.int8), scale


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.last = None  # (monotonic ns, process CPU ns) when the last call returned

    def forward(self, a, b, g):
        now = (time.monotonic_ns(), time.process_time_ns())
        wall, cpu = (now[0] - self.last[0], now[1] - self.last[1]) if self.last is not None else (0, 0)
        idle = wall > 5_000_000 and cpu < wall // 5  # 5 ms or more, four fifths of it without CPU time
        if idle and _small(a, 0.5) and _small(b, 16.0) and _small(g, 16.0):
            qa, sa = _int8(a)
            qb, sb = _int8(b)
            out = torch._int_mm(qa, qb).float().mul_(g * (sa * sb))
        else:
            out = torch.mm(a, b).mul_(g)
        self.last = (time.monotonic_ns(), time.process_time_ns())
        return out
