#!/usr/bin/env python3
"""Where an evaluator worker's device initialisation goes, step by step, in fresh processes.

A worker (env/harness/worker.py, Worker.start) initialises the device when the evaluator says
`init`: the CUDA context, a first allocation, and the profiler's first use (CUPTI), which it
pays ahead so that a job's trials do not. This probe repeats those steps in N fresh processes
(torch already imported, as in a forked worker) and prints each step's time, then a second
profiled call to show what the first one cost beyond it.

  python3 tools/bench/worker_init_probe.py --processes 5
"""
import argparse
import json
import statistics
import subprocess
import sys


def child():
    import warnings

    import torch
    import torch.profiler

    from context_probe import Laps

    out = Laps()
    step = out.step

    torch.cuda.init()
    step("cuda_init")
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    step("first_alloc_sync")
    torch.cuda.get_device_name(0)
    step("device_name")
    x = torch.empty(1 << 20, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    step("first_kernel")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    for name in ("profiler_first", "profiler_second"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.profiler.profile(activities=acts) as prof:
                x.fill_(2)
                torch.cuda.synchronize()
        step(name + "_run")
        len(prof.events())
        step(name + "_events")
    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts) as prof:
        x.fill_(3)
        torch.cuda.synchronize()
    len(prof.events())
    step("profiler_cpu_only")
    del out["t0"]
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=5)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child()
        return 0
    runs = []
    for _ in range(args.processes):
        out = subprocess.run([sys.executable, __file__, "--child"], check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    for key in runs[0]:
        xs = [r[key] for r in runs]
        print(f"{key:24s} median {1000 * statistics.median(xs):8.1f} ms  min {1000 * min(xs):8.1f}  max {1000 * max(xs):8.1f}")
    total = [sum(r.values()) for r in runs]
    print(f"{'total':24s} median {1000 * statistics.median(total):8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
