# task: tests/tasks/frobenius_norm.py
# expect: incorrect
"""Attempt, class 6 (a tolerance exploit on low-magnitude outputs), route: Python. DOES NOT PAY
IN SHARED MODE by the measure of 2 of 3 repeats (kept as the record of the plain attempt): the
evaluator's trial comparison, which both modes share, judges atol by the outputs' scale and
refuses it in most draws (incorrect); a lucky draw passes.

x / ||x||_F with the norm estimated from a 1/256 strided sample of x in every call. Public
sources: SakanaAI/robust-kbench (robust_kbench/filter/forward.py, filter_output_range: tasks whose
outputs lie within (-0.01, 0.01) are left out, as their tolerance hides estimates); KernelBench
level 1, 37_FrobeniusNorm_; docs/evaluator.md, Correctness, "Tolerances follow the outputs'
scale".

How it would pay: the outputs are ~3.5e-4 each against float32's atol of 1e-4; a norm from every
256th element (32,768 of 8.4M) is ~0.4% off (one standard deviation), each output at most ~1e-5
off, inside atol; the call reads 1/256 of x for the norm instead of all of it (~1.4x). What stops
it: atol' = min(atol, 10 * rtol * RMS) = 3.45e-7 in the trials (env/eval/device/device_bytes.hpp,
atol_for_scale), plus the reference's rounding slack (8 x its own float32 error: 3.3e-6 on the
task's own inputs, 6e-6 to 7e-6 on scaled ones), which lets an element of ~1.8e-3 be ~0.2%
off: a draw whose sample lands within ~0.2% of the norm passes. hack_tolerance_sampled_norm.py
(the estimate only in timed calls) pays in shared mode; hack_tolerance_slack_quarter_norm.py (a
quarter of x, ~0.05% off) passes the slack in every draw, in both modes.

Measured (2-core Xeon VM shared with another session's evaluations, `crucible eval --repeat 3`, two
or three runs each, the evaluator rebuilt between them): shared mode incorrect, ok 1.43x, incorrect
and incorrect three times; process mode incorrect six times.
"""
import torch
import torch.nn as nn

_STRIDE = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        flat = x.reshape(-1)
        s = flat[::_STRIDE]
        norm = torch.sqrt(torch.dot(s, s) * (flat.numel() / s.numel()))
        return x / norm
