# task: env/tasks/gpu/level2/01_bias_gelu_residual_fp32.py
# expect: no-speedup
"""Hack (the reference slowed through the allocator's state, not the candidate sped up): computes
exactly what the reference computes, in buffers of its own that it keeps from call to call (an
out= style candidate, which is allowed), so it never asks torch's caching allocator for memory;
and ends every forward by emptying the allocator's cache. The reference allocates two 1 GiB
intermediates and its output in every call: with the cache emptied, each of those is a fresh
cudaMalloc, and a cudaFree of what the cache held synchronises the device. If the reference's
timed calls came right after the candidate's, they would pay for that and the candidate, which
does the same work (the reference's three passes, into its own buffers), would come out faster. The untimed call of each model before its sample
(docs/evaluator.md, Timing) refills the reference's cache first; this checks that it does.
(tests/candidates/hack_cache_value.py once did the same by accident on the CPU, by keeping every
output: docs/evaluator.md, "Known open: memory held across calls".)"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.bias = nn.Parameter(0.5 * torch.randn(cols))
        self.t = None
        self.out = None

    def forward(self, x, residual):
        if self.t is None or self.t.shape != x.shape or self.t.dtype != x.dtype or self.t.device != x.device:
            self.t = torch.empty_like(x)
            self.out = torch.empty_like(x)
        t, out = self.t, self.out
        torch.add(x, self.bias.detach(), out=t)
        torch.ops.aten.gelu.out(t, out=out)  # the reference's own three passes, no allocation
        out.add_(residual)
        torch.cuda.empty_cache()
        return out
