#!/usr/bin/env python3
"""Whether a starting worker's device initialisation disturbs a kernel timed beside it.

This process times one kernel back to back (CUDA events around each call, the device
synchronised after it, as the evaluator's timed rounds do) for the whole run. Meanwhile N
helper processes, each with torch imported and nothing on the device yet (a forked worker's
state), go one after another through an evaluator worker's start (env/harness/worker.py,
Worker.start) and then a reference's first calls:

  cuinit    torch.cuda.init() (the driver's initialisation, device properties)
  context   the first allocation and synchronisation (the CUDA context is made here)
  profiler  the profiler's first use (CUPTI)
  kernels   first calls of a few ops on fresh inputs (what a reference phase does)

Each step's start and end are read on the host's monotonic clock, which both processes share.
The timed calls are split by the step they overlap ("quiet": none) and each class's median,
90th and 99th percentile and maximum are printed, with the median's ratio to the quiet one.

  python3 tools/bench/init_interference.py [--helpers 10] [--rows 16384] [--out FILE.json]
"""
import argparse
import json
import statistics
import subprocess
import sys
import threading
import time

HELPER = r"""
import json, sys, time
import torch
import torch.profiler
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
marks = [time.monotonic()]
torch.cuda.init()
marks.append(time.monotonic())
torch.empty(1, device="cuda"); torch.cuda.synchronize()
marks.append(time.monotonic())
acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
with torch.profiler.profile(activities=acts):
    torch.empty(1, device="cuda").fill_(1); torch.cuda.synchronize()
marks.append(time.monotonic())
x = torch.randn(4096, 4096, device="cuda")
y = torch.nn.functional.layer_norm(x, (4096,)); z = x @ x; w = torch.softmax(x, -1); torch.cuda.synchronize()
marks.append(time.monotonic())
sys.stdout.write(json.dumps(marks) + "\n"); sys.stdout.flush()
"""
STEPS = ["cuinit", "context", "profiler", "kernels"]


def summary(xs):
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return {"n": len(xs), "median_ms": statistics.median(xs), "p90_ms": pick(0.9), "p99_ms": pick(0.99), "max_ms": xs[-1]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--helpers", type=int, default=10)
    ap.add_argument("--rows", type=int, default=16384, help="rows of the timed layer_norm's 4096-column input")
    ap.add_argument("--quiet-s", type=float, default=2.0, help="quiet time before the first helper and after the last")
    ap.add_argument("--out")
    args = ap.parse_args()

    import torch

    helpers = [subprocess.Popen([sys.executable, "-c", HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for _ in range(args.helpers)]
    for h in helpers:
        if h.stdout.readline().strip() != "ready":
            sys.exit("a helper did not start (is torch installed?)")

    x = torch.randn(args.rows, 4096, device="cuda")
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(50):  # warm-up: kernels loaded, clocks up
        torch.nn.functional.layer_norm(x, (4096,))
    torch.cuda.synchronize()

    windows = []  # (step, t0, t1)
    done = threading.Event()

    def drive():
        time.sleep(args.quiet_s)  # quiet samples before the first helper (a schedule, not a synchronisation)
        for h in helpers:
            h.stdin.write("go\n")
            h.stdin.flush()
            marks = json.loads(h.stdout.readline())
            h.wait()
            for name, a, b in zip(STEPS, marks, marks[1:]):
                windows.append((name, a, b))
        time.sleep(args.quiet_s)
        done.set()

    driver = threading.Thread(target=drive)
    driver.start()
    samples = []  # (host start, host end, device ms)
    while not done.is_set():
        t0 = time.monotonic()
        ev0.record()
        torch.nn.functional.layer_norm(x, (4096,))
        ev1.record()
        torch.cuda.synchronize()
        samples.append((t0, time.monotonic(), ev0.elapsed_time(ev1)))
    driver.join()

    classes = {"quiet": []}
    for s0, s1, ms in samples:
        hit = [name for name, a, b in windows if s0 < b and a < s1]
        classes.setdefault(hit[0] if hit else "quiet", []).append(ms)
    quiet = statistics.median(classes["quiet"])
    result = {"gpu": torch.cuda.get_device_name(0), "rows": args.rows, "helpers": args.helpers,
              "step_s": {name: statistics.median(b - a for n, a, b in windows if n == name) for name in STEPS}}
    print(f"{result['gpu']}: layer_norm of {args.rows}x4096 fp32 timed beside {args.helpers} starting workers")
    print(f"median step time in a helper: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in result["step_s"].items()))
    print(f"{'overlapping':<10} {'calls':>6} {'median ms':>10} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} {'median/quiet':>13}")
    for name in ["quiet"] + STEPS:
        if not classes.get(name):
            continue
        s = summary(classes[name])
        s["median_vs_quiet"] = s["median_ms"] / quiet
        result[name] = s
        print(f"{name:<10} {s['n']:>6} {s['median_ms']:>10.4f} {s['p90_ms']:>8.4f} {s['p99_ms']:>8.4f} {s['max_ms']:>8.4f} "
              f"{s['median_vs_quiet']:>13.4f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
