#!/usr/bin/env python3
"""Medians of an evaluation's steps, from a bench_eval_throughput --verbose 1 log.

    bench_eval_throughput --device cuda:0 --concurrency 6 --candidates 40 --verbose 1 > log 2>&1
    python3 tools/bench/eval_laps.py log

Reads the workers' own laps ("worker host ms; STEP MS; ...", sent with every `done`) and the
evaluator's "reference outputs received in S s, copied in S s" lines of the measured pass (the
lines after the warm-up pass's summary) and prints each step's median, 90th percentile and
count in milliseconds.
"""
import argparse
import collections
import re
import statistics
import sys


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    args = ap.parse_args()
    steps = collections.defaultdict(list)
    measured = False
    received = re.compile(r"reference outputs received in ([0-9.]+) s, copied in ([0-9.]+) s")
    with open(args.log, errors="replace") as f:
        for line in f:
            if line.startswith("warm-up (builds extensions):"):
                measured = True
                continue
            if not measured:
                continue
            if "worker host ms;" in line:
                for part in line.split("worker host ms;", 1)[1].split(";"):
                    part = part.strip()
                    name, _, value = part.rpartition(" ")
                    try:
                        steps["worker: " + name].append(float(value))
                    except ValueError:
                        pass
            elif m := received.search(line):
                steps["evaluator: reference outputs received (mapped)"].append(1e3 * float(m.group(1)))
                steps["evaluator: reference outputs copied"].append(1e3 * float(m.group(2)))
    if not steps:
        sys.exit(f"{args.log}: no laps after the warm-up pass (was --verbose 1 given?)")
    width = max(len(k) for k in steps)
    print(f"{'step':<{width}}  median ms    p90 ms  count")
    for name in sorted(steps):
        xs = steps[name]
        print(f"{name:<{width}}  {statistics.median(xs):9.1f} {quantile(xs, 0.9):9.1f}  {len(xs):5d}")


if __name__ == "__main__":
    main()
