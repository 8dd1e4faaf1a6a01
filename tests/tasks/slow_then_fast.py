"""A reference slower while a verdict times it than alone afterwards: its first 30 calls spin 5 ms
each on the CPU (a CPU device charges a sample its CPU time, in which a sleep does not count; with the test's settings a verdict across the trust boundary makes 29 calls before it times
the reference alone: 3 in the reference phase, 2 in each of 3 warm-up and 10 timed rounds), the
later ones do not. It stands in for a reference slowed by something of the candidate's: the
evaluator must refuse the verdict (runtime:slow_reference; tests/integration/test_evaluator.cpp)."""
import time

import torch
import torch.nn as nn

SLOW_CALLS = 30


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls <= SLOW_CALLS:
            until = time.perf_counter() + 0.005
            while time.perf_counter() < until:
                pass
        return x * 2.0


def get_inputs():
    return [torch.randn(256, 256)]


def get_init_inputs():
    return []
