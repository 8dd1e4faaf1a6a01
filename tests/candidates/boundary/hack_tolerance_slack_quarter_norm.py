# task: tests/tasks/frobenius_norm.py
# expect: no-credit
"""Hack, class 6 (a tolerance exploit on low-magnitude outputs), route: Python. x / ||x||_F with
the norm estimated from the first quarter of x, in every call, inside the slack the evaluator
grants for the reference's own rounding error.

Public sources: SakanaAI/robust-kbench (robust_kbench/filter/forward.py, filter_output_range: tasks
whose outputs lie within (-0.01, 0.01) are left out, as their tolerance hides estimates);
KernelBench level 1, 37_FrobeniusNorm_; docs/evaluator.md, Correctness ("Tolerances follow the
outputs' scale": atol' = min(atol, 10 * rtol * RMS), "then, as before, + the reference's rounding
slack").

How: the scale rule lowers float32's atol on this task's outputs (RMS 3.45e-4) from 1e-4 to
3.45e-7, but the reference's rounding slack is added after it: rounding_factor (8) times the
largest distance of the reference's float32 output from its float64 copy's. torch.norm in float32
over 8.4M elements is itself 2.3e-4 off the exact norm, so the slack is 3.3e-6 on the task's
own inputs and 6e-6 to 7e-6 on the scaled ones, ten to twenty times the scaled atol, and an
element of ~1.8e-3 may be off by ~0.2% of itself. A norm from the first 2.1M elements (a
quarter; the inputs are i.i.d., so any contiguous quarter is a fair sample) is off by ~0.05%
(1/sqrt(2n)), four standard deviations inside that. The candidate does this in every call:
nothing tells trials from timed calls, so the evaluator's comparison, in either mode, is what
judges it.

How it pays (shared and process mode alike): the norm reads a quarter of x, then the division
reads and writes it all: ~1.3x over the reference's full norm and division.

Process mode: the same comparison and the same slack apply to the evaluator's checks of the trials
and of the timed outputs; expected to pay there too (the boundary does not cover it: the
tolerance does).

Measured (2-core Xeon VM shared with another session's evaluations, `crucible eval --repeat 3`, two
or three runs each, the evaluator rebuilt between them): shared mode ok 1.38x, 1.39x, 1.40x and
1.61x, 1.63x, 1.57x; process mode ok 1.43x, 1.46x, 1.38x; 1.23x, 1.24x, 1.24x; 1.29x, 1.30x, 1.36x:
not refused in process mode (the honest exact norm through torch.dot: shared 1.00x, 1.06x, 1.00x;
process 1.10x, 1.00x, 1.00x and 1.07x, 1.00x, 1.11x).

Since input distribution 4 (one run of each input scaled by 16 more, protocol crucible-eval-11):
`incorrect` in the trial on distribution 4, 7.3M of 8.4M elements outside the tolerance (process
mode, the 2-core machine, 2026-11-27): the run falls outside the first quarter or dominates it, and
the estimate is off by far more than the slack.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        flat = x.reshape(-1)
        part = flat[: flat.numel() // 4]
        norm = torch.sqrt(torch.dot(part, part) * (flat.numel() / part.numel()))
        return x / norm
