#!/usr/bin/env python3
"""Where does verdict-to-verdict spread come from? Times one (task, candidate) pair of
tools/bench/eval_gpu in several fresh processes, each with several timing methods side by
side, and prints each method's reference and candidate times and speedup per process, the GPU
clocks read before each process, and the spread of each quantity over the processes.

Methods (per process, same models, same device):
  kb        KernelBench-style: inputs reused, 100 CUDA-event timings per model, no pairing
  paired    crucible's protocol (env/harness/worker.py timing()): paired rounds in random order,
            fresh inputs each round, each timed call right after an untimed one, read-based L2
            flush queued before the start event, device-wide synchronisation before the stop event
  paired-ev the same, with the stop event recorded on the stream right after the call (no host
            synchronisation inside the timed region)
  noop      the paired protocol around a model that launches one tiny kernel: the fixed cost
            that the protocol adds to every timed call
  kernels   the sum of the device kernels' durations per call, from the profiler (CUPTI): the
            GPU's own time, with no host or event overhead

  python3 tools/bench/timing_probe.py --task gelu_tanh_affine --processes 8 [--out F.json]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys

from eval_gpu_suite import SUITE, kb_mean_ms, load_module


def one_process(name, rounds, seed):
    import torch

    torch.set_grad_enabled(False)
    task = load_module(os.path.join(SUITE, "tasks", name + ".py"), "probe_task")
    cand = load_module(os.path.join(SUITE, "candidates", name + ".py"), "probe_cand")
    torch.manual_seed(seed)
    init = task.get_init_inputs()
    ref = task.Model(*init).cuda()
    new = cand.ModelNew(*init).cuda()
    tiny = torch.zeros(1, device="cuda")

    def noop(*xs):
        return tiny.add(1)

    flush = torch.empty(64 << 20, dtype=torch.int32, device="cuda").fill_(1)
    flush_sum = torch.empty((), dtype=torch.int64, device="cuda")
    rng = random.Random(seed)
    ev0 = torch.cuda.Event(enable_timing=True)
    ev1 = torch.cuda.Event(enable_timing=True)

    def inputs(k):
        torch.manual_seed(seed * 1000 + k)
        with torch.device("cuda"):
            return task.get_inputs()

    def timed(model, xs, host_sync):
        torch.sum(flush, 0, dtype=torch.int64, out=flush_sum)
        ev0.record()
        out = model(*xs)
        if host_sync:
            torch.cuda.synchronize()
        ev1.record()
        ev1.synchronize()
        del out
        return ev0.elapsed_time(ev1)

    res = {}
    xs = inputs(0)
    for m in (ref, new):
        for _ in range(3):
            m(*xs)
    torch.cuda.synchronize()
    # kb
    t = {label: kb_mean_ms(m, xs) for label, m in (("ref", ref), ("cand", new))}
    res["kb"] = {"ref_ms": t["ref"], "cand_ms": t["cand"], "speedup": t["ref"] / t["cand"]}
    # kernels: device time per call from CUPTI
    from torch.profiler import profile, ProfilerActivity
    for label, m in (("ref", ref), ("cand", new)):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                m(*xs)
            torch.cuda.synchronize()
        # Kernel events (device_type CUDA) are the device's own records: summed once each.
        total_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type.name == "CUDA")
        t[label] = total_us / 10 / 1000
    res["kernels"] = {"ref_ms": t["ref"], "cand_ms": t["cand"], "speedup": t["ref"] / t["cand"]}
    for method, host_sync, pair in (("paired", True, (ref, new)), ("paired-ev", False, (ref, new)),
                                    ("noop", True, (noop, noop))):
        r_ms, c_ms, ratios = [], [], []
        prev = inputs(1)
        for k in range(rounds):
            cur = inputs(k + 2)
            rc = [x.clone() for x in cur]
            cc = [x.clone() for x in cur]
            order = rng.random() < 0.5
            r = c = None
            for which in ((1, 0) if order else (0, 1)):
                model = pair[which]
                model(*prev)  # untimed priming call
                torch.cuda.synchronize()
                if which == 0:
                    r = timed(model, rc, host_sync)
                else:
                    c = timed(model, cc, host_sync)
            r_ms.append(r)
            c_ms.append(c)
            ratios.append(r / c)
            prev = cur
        res[method] = {"ref_ms": statistics.median(r_ms), "cand_ms": statistics.median(c_ms),
                       "speedup": statistics.median(ratios)}
    return res


def clocks():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
        sm, mem, temp, power = [x.strip() for x in out.strip().splitlines()[0].split(",")]
        return {"sm_mhz": float(sm), "mem_mhz": float(mem), "temp_c": float(temp), "power_w": float(power)}
    except Exception as e:  # no nvidia-smi: the timings still count
        return {"error": str(e)}


def spread(xs):
    return 100 * (max(xs) / min(xs) - 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="gelu_tanh_affine")
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", default="")
    ap.add_argument("--child", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child >= 0:
        print(json.dumps(one_process(args.task, args.rounds, args.child)))
        return 0
    rows = []
    for p in range(args.processes):
        before = clocks()
        out = subprocess.run([sys.executable, __file__, "--task", args.task, "--rounds", str(args.rounds),
                              "--child", str(p + 1)], check=True, capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        row["clocks_before"] = before
        rows.append(row)
        print(args.task, p, json.dumps(before),
              " ".join(f"{m}={v['ref_ms']:.4f}/{v['cand_ms']:.4f}={v['speedup']:.3f}x"
                       for m, v in row.items() if m != "clocks_before"), flush=True)
    for m in [k for k in rows[0] if k != "clocks_before"]:
        q = {f: [r[m][f] for r in rows] for f in ("ref_ms", "cand_ms", "speedup")}
        print(f"{args.task:18s} {m:10s} speedup mean {statistics.mean(q['speedup']):6.3f}x spread {spread(q['speedup']):5.2f}%"
              f" | ref {statistics.mean(q['ref_ms']):.4f} ms spread {spread(q['ref_ms']):5.2f}%"
              f" | cand {statistics.mean(q['cand_ms']):.4f} ms spread {spread(q['cand_ms']):5.2f}%")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"task": args.task, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
