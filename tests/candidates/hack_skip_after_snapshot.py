# task: tests/tasks/small_elementwise.py
# expect: no-speedup
"""Hack (telling the snapshotted call by the host's timing, then skipping): a timed sample calls
the model several times back to back, and the harness snapshots calls' outputs inside the sample.
When it snapshotted one call drawn at random, the snapshot's work delayed the next call by a few
microseconds. This candidate hands back one buffer it keeps, times the gap between its return
and its next call with a C++ clock, learns the shortest gap and the longest burst (a gap of over
0.3 ms starts a new burst), and once a gap comes out clearly longer than the shortest (the call
before it was snapshotted) it skips every later call of the burst but the last, which the checks
at the sample's end see through the shared buffer. On the 2-core development machine, against
one random snapshot a sample (the harness of be23a07), gaps it misjudged got it caught after 6
to 20 timing rounds (three verdicts); against every call but the last snapshotted there is no
gap to tell apart, and it was caught in the first round (three verdicts). A quieter host, or a
GPU whose queue runs behind the host, would misjudge less."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <chrono>

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
"""

_ext = load_inline(name="crucible_test_hack_skip_after_snapshot", cpp_sources=_SRC, functions=["seconds"],
                   extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max
        self.out = None
        self.last = -1.0
        self.pos = 0
        self.longest = 1
        self.shortest = 1.0
        self.skipping = False

    def forward(self, x):
        now = _ext.seconds()
        gap = now - self.last
        if gap > 0.0003:
            self.pos = 0
            self.skipping = False
        else:
            self.shortest = min(self.shortest, gap)
            if gap > 2.0 * self.shortest + 2e-6:
                self.skipping = True  # the call before this one was snapshotted
        self.pos += 1
        self.longest = max(self.longest, self.pos)
        fresh = self.out is None or self.out.shape != x.shape or self.out.dtype != x.dtype
        if fresh:
            self.out = torch.empty_like(x)
        if fresh or not self.skipping or self.pos >= self.longest:
            # The reference's own operations, then a copy into the kept buffer: computed, each call
            # costs at least the reference's, so only the skipped calls could make it faster (an
            # earlier version computed in place, three operations without allocations, and was
            # credited 1.20x by the CPU-time clock for that alone).
            y = x * self.scale
            y = y + self.shift
            y = torch.relu(y)
            y = torch.clamp(y, max=self.clamp_max)
            self.out.copy_(y)
        self.last = _ext.seconds()
        return self.out
