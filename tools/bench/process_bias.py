#!/usr/bin/env python3
"""Two processes, one code: how far apart this host times them. The CPU boundary times the reference
and the candidate in two worker processes (docs/evaluator.md, Timing); whatever makes one process
slower than its twin for its whole life is a bias no number of paired rounds takes out. This
measures it without the evaluator: PAIRS pairs of processes forked from one parent, each running
01_relu_scale's chain (four passes over 2M floats, one thread) alternately ROUNDS times, the cache
flushed before each call; per pair the ratio of the two processes' median call times.

  .venv/bin/python tools/bench/process_bias.py [--pairs 6] [--rounds 80] [--huge-pages]

Prints one line a pair and the spread of the ratios. On a host whose processes run alike the
ratios stay within the paired rounds' own noise (a few percent). Measured on the 2-core CI VM (AMD
EPYC, 2026-11-29), six pairs of 60 rounds a run: 0.962-1.082 and 0.946-1.158 (2.5-2.7 ms a call);
with --huge-pages 1.010-1.094 and 0.956-1.064 (2.0-2.2 ms a call): a bias of up to 16% that a
process keeps for its life, narrower on huge pages. Exit 0.
"""
import argparse
import os
import statistics
import time

import sys

# The workers' own settings (env/eval/sandbox.cpp): one thread, large buffers reusing freed memory
# (glibc reads its MALLOC_ variables when the process starts, so the script starts itself again
# with them), and with --huge-pages torch's large CPU allocations on transparent huge pages.
_ENV = {"OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "1073741824"}
if "--huge-pages" in sys.argv:
    _ENV["THP_MEM_ALLOC_ENABLE"] = "1"
if any(os.environ.get(k) != v for k, v in _ENV.items()):
    os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, **_ENV})

import torch  # noqa: E402


def child(go_fd, out_fd):
    torch.set_num_threads(1)
    x = torch.randn(2048, 1024)
    flush = torch.empty(16 * 1024 * 1024)  # 64 MB, twice the last-level cache of the CI machine
    while True:
        if os.read(go_fd, 1) == b"q":
            os._exit(0)
        flush.add_(1)
        t = time.perf_counter()
        y = x * 2.0
        y = y + 0.5
        y = torch.relu(y)
        y = torch.clamp(y, max=6.0)
        dt = time.perf_counter() - t
        os.write(out_fd, (f"{dt:.9f}").encode().ljust(16))


def spawn():
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        child(go_r, out_w)
    return pid, go_w, out_r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=80)
    ap.add_argument("--huge-pages", action="store_true",
                    help="the workers' large allocations on transparent huge pages (evaluator.huge_pages)")
    a = ap.parse_args()
    ratios = []
    for p in range(a.pairs):
        procs = [spawn(), spawn()]
        times = [[], []]
        for r in range(a.rounds):
            for i in ((0, 1) if r % 2 else (1, 0)):
                os.write(procs[i][1], b"g")
                times[i].append(float(os.read(procs[i][2], 16)))
        for pid, go_w, _ in procs:
            os.write(go_w, b"q")
            os.waitpid(pid, 0)
        warm = a.rounds // 8
        m = [statistics.median(t[warm:]) * 1e3 for t in times]
        ratios.append(m[0] / m[1])
        print(f"pair {p}: {m[0]:.3f} ms against {m[1]:.3f} ms, ratio {ratios[-1]:.3f}")
    print(f"ratios {min(ratios):.3f}-{max(ratios):.3f} (spread {100 * (max(ratios) - min(ratios)):.1f} points)")


if __name__ == "__main__":
    main()
