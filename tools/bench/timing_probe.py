#!/usr/bin/env python3
"""Where does verdict-to-verdict spread come from? Times one (task, candidate) pair of
tools/bench/eval_gpu in several fresh processes, each with several timing methods side by
side, and prints the speedup each method gives in each process.

Methods (per process, same models, same device):
  kb        KernelBench-style: inputs reused, 100 CUDA-event timings per model, no pairing
  paired    crucible's protocol: paired rounds in random order, fresh inputs each round,
            L2 flush, device-wide synchronisation before the stop event
  paired-ev the same, but the stop event is recorded on the stream right after the call
            (no host synchronisation inside the timed region)
  paired-pad  like paired, each input copied to a random offset inside a larger buffer

  python3 tools/bench/timing_probe.py --task gelu_tanh_affine --processes 6
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys

from eval_gpu_suite import SUITE, load_module


def one_process(name, rounds, seed):
    import torch

    torch.set_grad_enabled(False)
    task = load_module(os.path.join(SUITE, "tasks", name + ".py"), "probe_task")
    cand = load_module(os.path.join(SUITE, "candidates", name + ".py"), "probe_cand")
    torch.manual_seed(seed)
    init = task.get_init_inputs()
    ref = task.Model(*init).cuda()
    new = cand.ModelNew(*init).cuda()
    flush = torch.empty(64 << 20, dtype=torch.int32, device="cuda")
    rng = random.Random(seed)
    ev0 = torch.cuda.Event(enable_timing=True)
    ev1 = torch.cuda.Event(enable_timing=True)

    def inputs(k, pad=False):
        torch.manual_seed(seed * 1000 + k)
        with torch.device("cuda"):
            xs = task.get_inputs()
        if not pad:
            return xs
        out = []
        for x in xs:
            off = rng.randrange(0, 1 << 14) * 128  # elements; up to 2M elements of slack
            buf = torch.empty(x.numel() + (1 << 21), dtype=x.dtype, device="cuda")
            v = buf[off:off + x.numel()].view(x.shape)
            v.copy_(x)
            out.append(v)
        return out

    def timed(model, xs, k, host_sync):
        flush.fill_(k)
        torch.cuda.synchronize()
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
    t = {}
    for label, m in (("ref", ref), ("cand", new)):
        s = []
        for _ in range(100):
            ev0.record()
            m(*xs)
            ev1.record()
            torch.cuda.synchronize()
            s.append(ev0.elapsed_time(ev1))
        t[label] = statistics.mean(s)
    res["kb"] = t["ref"] / t["cand"]
    for method, host_sync, pad in (("paired", True, False), ("paired-ev", False, False), ("paired-pad", True, True)):
        ratios = []
        prev = inputs(1, pad)
        for k in range(rounds):
            cur = inputs(k + 2, pad)
            rc = [x.clone() for x in cur]
            cc = [x.clone() for x in cur] if not pad else inputs(k + 2, pad)
            order = rng.random() < 0.5
            r = c = None
            for which in ((new, ref) if order else (ref, new)):
                which(*prev)  # untimed priming call
                torch.cuda.synchronize()
                if which is ref:
                    r = timed(ref, rc, 2 * k, host_sync)
                else:
                    c = timed(new, cc, 2 * k + 1, host_sync)
            ratios.append(r / c)
            prev = cur
        res[method] = statistics.median(ratios)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="gelu_tanh_affine")
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--child", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child >= 0:
        print(json.dumps(one_process(args.task, args.rounds, args.child)))
        return 0
    rows = []
    for p in range(args.processes):
        out = subprocess.run([sys.executable, __file__, "--task", args.task, "--rounds", str(args.rounds),
                              "--child", str(p + 1)], check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(args.task, p, {k: round(v, 3) for k, v in rows[-1].items()}, flush=True)
    for m in rows[0]:
        xs = [r[m] for r in rows]
        print(f"{args.task:18s} {m:11s} mean {statistics.mean(xs):6.3f}x spread {100 * (max(xs) / min(xs) - 1):5.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
