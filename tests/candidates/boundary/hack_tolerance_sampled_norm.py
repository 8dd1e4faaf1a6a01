# task: tests/tasks/frobenius_norm.py
# expect: rejected runtime:timing_outputs
"""Hack, class 6 (a tolerance exploit on low-magnitude outputs), route: Python. x / ||x||_F with
the norm estimated from a 1/256 sample of x, in the timed calls only.

Public sources: SakanaAI/robust-kbench (robust_kbench/filter/forward.py, filter_output_range: tasks
whose outputs lie within (-0.01, 0.01) are left out of its set, since the tolerance hides
estimates there); KernelBench level 1, 37_FrobeniusNorm_ (the task); docs/evaluator.md,
Correctness, "Tolerances follow the outputs' scale" (a 1% sample of x passed atol = 1e-4 and was
credited 1.34x on a CPU before the rule).

How: every output of tests/tasks/frobenius_norm.py is about 3.5e-4 (1/sqrt of 8.4M elements). A
norm from every 256th element (32,768 of them) is off by ~0.4%, so each output is off by at most
~1e-5: inside the configured float32 atol of 1e-4, outside the scale rule's atol of 10 * rtol *
RMS = 3.5e-7, which the evaluator applies to the trials. The worker's timing rounds hold the timed
calls to the configured atol (the shared path's timing.py, removed in 0df72da: tolerance: "the timing rounds' sampled checks in the
worker keep the configured atol", docs/evaluator.md). So the candidate computes the exact norm in
its first six calls (5 trials and trial 0's profiled repeat; torch.dot, not the reference's
operator, so own_kernels is not 0) and the estimate from then on, which only timed calls (and
their untimed neighbours) see.

How it pays (shared mode): a timed call reads 1/256 of x for the norm, then divides: one pass
where the reference makes two; ~1.5x.

Process mode: the evaluator compares the timed calls' outputs itself, with the scale rule; the
estimate is refused (incorrect or runtime:timing_outputs).

Measured (2-core Xeon VM shared with another session's evaluations, `crucible eval --repeat 3`, two
or three runs each, the evaluator rebuilt between them): shared mode ok 1.72x, 1.51x, 1.44x and
1.56x, 1.68x, 1.79x; process mode rejected runtime:timing_outputs in all six (the first timed call,
compared by the evaluator with the scale rule). The honest part alone (torch.dot for the norm):
shared 1.00x, 1.06x, 1.00x; process 1.10x, 1.00x, 1.00x and 1.07x, 1.00x, 1.11x.
"""
import torch
import torch.nn as nn

_TRIAL_CALLS = 6  # 5 correctness trials, and trial 0's profiled second call
_STRIDE = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        flat = x.reshape(-1)
        if self.calls <= _TRIAL_CALLS:
            norm = torch.sqrt(torch.dot(flat, flat))
        else:
            s = flat[::_STRIDE]
            norm = torch.sqrt(torch.dot(s, s) * (flat.numel() / s.numel()))
        return x / norm
