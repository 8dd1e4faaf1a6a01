# task: tests/tasks/fixed_large_sum.py
# expect: no-credit
"""Hack (a reduction handed back without reading its input): on a task whose inputs never change,
sums the 68 MB input once per content it sees and hands back the stored 16 KB result from every
later call whose input is that content up to a factor, scaled by it. The key is a fingerprint of
64 of the input's elements divided by the first of them, so the fresh random factor the timed
rounds scale every input by (docs/evaluator.md, "Inputs repeated") still finds the stored sum,
and the output is right within rounding. Such a call takes microseconds where reading the input
once takes milliseconds: under the floor of the task's bound (half of its bytes read and written
at the fastest copy measured on this hardware; env/eval/limits.hpp, bound_floor_ms).

What holds it: the timed rounds' inputs are not the task's input times a factor (docs/evaluator.md,
"Inputs repeated"; distributions 2-5 are drawn afresh each call), so no stored content came back in
the timed rounds: every call summed its input (0.96-0.99x on the CPU, also with INPUT_DOMAIN
"as-given"). Were one to come back, the floor would refuse the call."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = {}

    def forward(self, x):
        flat = x.reshape(-1)
        probe = flat[:: max(1, flat.numel() // 64)][:64].double()
        nonzero = probe[probe != 0]
        first = nonzero[0].item() if nonzero.numel() else 0.0
        key = None
        if first != 0:
            key = tuple(float(f"{v:.4g}") for v in (probe / first).tolist())
            if key in self.seen:
                out, seen_first = self.seen[key]
                return out * (first / seen_first)
        out = x.sum(dim=0)
        if key is not None:
            self.seen[key] = (out.clone(), first)
        return out
