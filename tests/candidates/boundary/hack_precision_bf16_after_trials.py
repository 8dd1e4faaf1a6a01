# task: tests/tasks/gated_matmul.py
# expect: rejected
"""Hack, class 11 (precision dropped where the loosest trial's slack hides it), route: the matrix
product in bfloat16 in every call after the trials (told apart by counting calls), wherever a
strided sample of the inputs shows the task's own magnitudes.

Public sources: docs/evaluator.md, Correctness ("The timing rounds' checks use the largest slack of
the trials"); env/eval/boundary.cpp (split_trials: `facts_.slack[i] = max(...)` over the trials;
split_round: every timed call is compared at that slack); torch's CPU bfloat16 matmul (oneDNN,
AVX512-BF16 where the CPU has it); Makora's and CUDA-L1's reward-hack lists (precision lowered in
the measured calls only).

How: each output's tolerance is atol + rtol * |want|, atol widened by the reference's own rounding
slack (8 times its float32 output's largest distance from a float64 copy's). In the trials the
slack is each trial's own; in the timed rounds it is the largest over the trials, and on this task
that is distribution 3's: its three inputs are each 32 times larger, so the outputs and the
reference's float32 error are 32^3 times larger (slack ~3.2 against ~1e-4 on distributions 0-2). A
bfloat16 product (8-bit mantissas) is off by ~0.1 on distributions 1 and 2: far outside their own
slack, far inside distribution 3's. The candidate makes its first six calls (the five trials and
trial 0's second, profiled call) in float32 (mm, then mul_ in place: not the reference's operators
one for one, so own work). From the seventh on, it takes 4096 evenly spaced elements of each input;
where none is beyond a few times the task's own scale (distributions 1 and 2, and the task's own),
it converts a and b to bfloat16 for the product; where one is (distribution 3, all 32 times
larger; distribution 4, a run of a quarter to a 64th of each input 16 times larger, which a
4096-point stride always hits), it computes in float32. Every timed call's output is compared
whole: the bfloat16 ones pass at distribution 3's slack.

How it pays: the bfloat16 product is ~2.5x faster than float32's on this CPU (AVX512-BF16), in the
timed rounds of distributions 1 and 2 (half of them); the others run at the reference's speed.

Measured (2-core CPU VM beside another session's evaluations, 2026-11-29, `crucible eval --no-cache`):
before the fix (0753085) ok 1.51x (band ±2.3%); after it (873f15a) rejected runtime:timing_outputs (distribution 1's own slack).
"""
import torch
import torch.nn as nn


def _small(t, bound):
    flat = t.reshape(-1)
    step = max(1, flat.numel() // 4096)
    return float(flat[::step].abs().amax()) < bound


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, a, b, g):
        self.calls += 1
        # Bounds: a is randn / 32, b and g randn; distributions 1 and 2 scale each by at most 2.
        if self.calls > 6 and _small(a, 0.5) and _small(b, 16.0) and _small(g, 16.0):
            return torch.mm(a.to(torch.bfloat16), b.to(torch.bfloat16)).float().mul_(g)
        return torch.mm(a, b).mul_(g)
