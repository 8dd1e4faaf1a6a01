#!/usr/bin/env python3
"""tools/bench/trace_steps.py TRACE.json [--delimiter SUBSTRING]: where a decoding step's device
time goes, from a Chrome trace that bench_decode --trace wrote. Steps are cut at the output
matrix's GEMM (the kernel whose name contains the delimiter, by default the one that runs once a
step and takes longest); for the median step it prints each kernel's calls, total and mean time
and the idle gaps between kernels."""
import argparse
import json
import statistics
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): "
                                        "decode throughput, where a batch-1 step goes "
                                        "(tools/bench/gpu_session.sh decode runs it). No environment variables.")
    ap.add_argument("trace")
    ap.add_argument("--delimiter", default="", help="substring of the kernel that ends each step")
    ap.add_argument("--width", type=int, default=70, help="characters of each kernel name shown")
    args = ap.parse_args()
    events = json.load(open(args.trace))["traceEvents"]
    dev = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    if not dev:
        raise SystemExit(f"{args.trace}: no device events")
    delim = args.delimiter
    if not delim:  # the longest kernel among those that run a few dozen times or more
        count = defaultdict(int)
        for e in dev:
            count[e["name"]] += 1
        many = [e for e in dev if count[e["name"]] >= 16]
        delim = max(many, key=lambda e: e["dur"])["name"]
    ends = [i for i, e in enumerate(dev) if delim in e["name"]]
    if len(ends) < 3:
        raise SystemExit(f"{args.trace}: fewer than 3 steps end in '{delim}'")
    steps = []
    for a, b in zip(ends, ends[1:]):
        seq = dev[a + 1:b + 1]
        span = seq[-1]["ts"] + seq[-1]["dur"] - (dev[a]["ts"] + dev[a]["dur"])
        steps.append((span, seq, dev[a]["ts"] + dev[a]["dur"]))
    spans = sorted(s[0] for s in steps)
    span, seq, start = sorted(steps, key=lambda s: s[0])[len(steps) // 2]
    per = defaultdict(lambda: [0, 0.0])
    gap, prev = 0.0, start
    for e in seq:
        gap += max(0.0, e["ts"] - prev)
        prev = max(prev, e["ts"] + e["dur"])
        per[e["name"]][0] += 1
        per[e["name"]][1] += e["dur"]
    print(f"{args.trace}: {len(steps)} steps ending in '{delim[:60]}'")
    print(f"step span median {statistics.median(spans):.1f} us (min {spans[0]:.1f}, max {spans[-1]:.1f}); "
          f"the median step: {len(seq)} device events, busy {span - gap:.1f} us, idle gaps {gap:.1f} us")
    print(f"{'total us':>9} {'calls':>5} {'mean us':>8}  kernel")
    for name, (c, t) in sorted(per.items(), key=lambda x: -x[1][1]):
        print(f"{t:9.1f} {c:5d} {t / c:8.2f}  {name[:args.width]}")


if __name__ == "__main__":
    main()
