#!/usr/bin/env python3
"""Does a kernel's speed depend on where its buffers lie in device memory, and does that differ
from one process to the next?

In the sixth session's precision runs, layernorm_manual's candidate (one 0.26 ms kernel) took
0.2556 ms in one worker process and 0.2673 ms in another, while each verdict's own band was
±0.4-1.0% (docs/PERFORMANCE.md). Inside one worker, each round's fresh inputs come from the
caching allocator, which hands back the same few blocks round after round, so a process keeps
one placement for its whole verdict. This probe times one model in N fresh processes, in three
ways per process:

  fresh     as the harness does: new inputs each round, cloned, from the caching allocator
  rotate    inputs copied into one of K buffers allocated up front (K distinct placements),
            taken in turn
  offset    like fresh, after a random-sized allocation (0-4 GiB) is made and kept first, so the
            process's blocks start elsewhere

Each timed call follows an L2 flush and is timed with CUDA events on the stream. For each way
the probe prints every process's median, and the spread of those medians over the processes
(max/min - 1). If `rotate` spreads much less than `fresh`, the harness should spread each
verdict's rounds over more placements.

  python3 tools/bench/placement_probe.py --task layernorm_manual --model candidate --processes 8
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys

from eval_gpu_suite import SUITE, load_module


def one_process(suite, name, which, rounds, buffers, seed, device):
    import torch

    torch.set_grad_enabled(False)
    rng = random.Random(seed)
    task = load_module(os.path.join(suite, "tasks", name + ".py"), "probe_task")
    torch.manual_seed(seed)
    init = task.get_init_inputs()
    if which == "candidate":
        model = load_module(os.path.join(suite, "candidates", name + ".py"), "probe_cand").ModelNew(*init)
    else:
        model = task.Model(*init)
    model = model.to(device)
    cuda = device.startswith("cuda")

    def inputs():
        with torch.device(device):
            return [x.to(device) if torch.is_tensor(x) else x for x in task.get_inputs()]

    flush = torch.ones((256 << 20) // 4, dtype=torch.int32, device=device)
    flush_sum = torch.empty((), dtype=torch.int64, device=device)

    def timed(args):
        torch.sum(flush, 0, dtype=torch.int64, out=flush_sum)
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(200_000)
            start.record()
            out = model(*args)
            stop.record()
            stop.synchronize()
            ms = start.elapsed_time(stop)
        else:
            import time
            t0 = time.perf_counter_ns()
            out = model(*args)
            ms = (time.perf_counter_ns() - t0) / 1e6
        del out
        return ms

    def clone(xs):
        return [x.clone() if torch.is_tensor(x) else x for x in xs]

    def fresh_way():
        times = []
        for _ in range(rounds):
            xs = clone(inputs())
            model(*xs)  # untimed priming call, as the harness makes
            times.append(timed(xs))
        return times

    def rotate_way():
        pool = [clone(inputs()) for _ in range(buffers)]
        times = []
        for r in range(rounds):
            xs = pool[r % buffers]
            for dst, src in zip(xs, inputs()):
                if torch.is_tensor(dst):
                    dst.copy_(src)
            model(*xs)
            times.append(timed(xs))
        del pool
        return times

    def offset_way():
        keep = None
        if cuda:
            keep = torch.empty(rng.randrange(0, 4 << 30, 2 << 20), dtype=torch.uint8, device=device)
        try:
            return fresh_way()
        finally:
            del keep

    ways = {"fresh": fresh_way, "rotate": rotate_way, "offset": offset_way}
    order = list(ways)
    rng.shuffle(order)  # no way always runs first in a process
    for _ in range(3):
        timed(clone(inputs()))  # warm-up calls
    out = {}
    for way in order:
        out[way] = statistics.median(ways[way]())
        if cuda:
            torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default=SUITE, help="a folder with tasks/ and candidates/ (tools/bench/eval_gpu)")
    ap.add_argument("--task", default="layernorm_manual")
    ap.add_argument("--model", choices=("candidate", "reference"), default="candidate")
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--buffers", type=int, default=16, help="K, the placements `rotate` cycles through")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="")
    ap.add_argument("--child", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child >= 0:
        print(json.dumps(one_process(args.suite, args.task, args.model, args.rounds, args.buffers, args.child, args.device)))
        return 0
    per_process = []
    for p in range(args.processes):
        cmd = [sys.executable, __file__, "--suite", args.suite, "--task", args.task, "--model", args.model, "--rounds", str(args.rounds),
               "--buffers", str(args.buffers), "--device", args.device, "--child", str(1000 + p)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        per_process.append(json.loads(out.strip().splitlines()[-1]))
    print(f"{args.task} {args.model}: median ms per process, {args.rounds} timed calls per way, "
          f"{args.buffers} buffers for rotate")
    summary = {}
    for way in ("fresh", "rotate", "offset"):
        meds = [p[way] for p in per_process]
        spread = max(meds) / min(meds) - 1 if min(meds) > 0 else float("nan")
        summary[way] = {"medians_ms": meds, "spread": spread}
        print(f"  {way:7s} spread {100 * spread:5.2f}%  " + " ".join(f"{m:.4f}" for m in meds))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
