#!/usr/bin/env python3
"""Medians of an evaluation's steps, from a bench_eval_throughput --verbose 1 log.

    bench_eval_throughput --device cuda:0 --concurrency 6 --candidates 40 --verbose 1 > log 2>&1
    python3 tools/bench/eval_laps.py log

Reads the workers' own laps ("worker host ms; STEP MS; ...", sent with every `done`) and the
evaluator's "reference outputs received in S s, copied in S s" lines of the measured pass (the
lines after the warm-up pass's summary), and each worker start's "ready in ..." line (its device
initialisation, the part holding the device, and the worker's driver, context and profiler
steps: "start: ..."), and prints each step's median, 90th percentile and count in milliseconds.
Then, from the evaluator's per-round lines ("rounds ref stream/synced : cand stream/synced"), the measured rounds that something disturbed on the device: a reference or
candidate stream time above 1.3 times its measurement's median (nothing else should run beside
measured rounds, so these count work that did).

With --whole the log is read from its first line, as `crucible eval --repeat N --verbose` writes
it (no warm-up pass), and the time from each verdict's start to its finish step ("finish at
+S s") is a step too:

    crucible eval --task T --candidate C --no-cache --repeat 10 --verbose > log 2>&1
    python3 tools/bench/eval_laps.py --whole log
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): "
                                        "evaluator throughput, the laps of each step\n"
                                        "(LAPS=1 tools/bench/gpu_session.sh throughput runs it). No environment variables.")
    ap.add_argument("log")
    ap.add_argument("--whole", action="store_true",
                    help="read the whole log (crucible eval --repeat N --verbose: no warm-up pass)")
    args = ap.parse_args()
    steps = collections.defaultdict(list)
    measured = args.whole
    finish = re.compile(r": finish at \+([0-9.]+) s")
    received = re.compile(r"reference outputs received in ([0-9.]+) s, copied in ([0-9.]+) s")
    ready = re.compile(r"ready in [0-9.]+ s \(device initialisation ([0-9.]+) s, ([0-9.]+) s of it holding the device: "
                       r"driver (-?[0-9.]+) ms, context (-?[0-9.]+) ms, profiler's first use (-?[0-9.]+) ms\)")
    pair = re.compile(r"([0-9.]+)/([0-9.]+):([0-9.]+)/([0-9.]+)")
    rounds = disturbed = measurements = disturbed_measurements = 0
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
            elif "rounds ref stream/synced" in line:
                times = [(float(a), float(c)) for a, _, c, _ in pair.findall(line.split("(ms):", 1)[1])]
                if not times:
                    continue
                ref_median = statistics.median(r for r, _ in times)
                cand_median = statistics.median(c for _, c in times)
                k = sum(1 for r, c in times if r > 1.3 * ref_median or c > 1.3 * cand_median)
                rounds += len(times)
                disturbed += k
                measurements += 1
                disturbed_measurements += k > 0
            elif m := finish.search(line):
                steps["evaluator: at finish, from the verdict's start"].append(1e3 * float(m.group(1)))
            elif m := ready.search(line):
                # A worker's start: the evaluator's view (all of it, the part holding the device)
                # and the worker's own laps of its three steps.
                steps["start: device initialisation"].append(1e3 * float(m.group(1)))
                steps["start: held"].append(1e3 * float(m.group(2)))
                for k, name in ((3, "driver"), (4, "context"), (5, "profiler's first use")):
                    if float(m.group(k)) >= 0:
                        steps["start: " + name].append(float(m.group(k)))
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
    if rounds:
        print(f"measured rounds disturbed (a stream time above 1.3x its measurement's median): {disturbed} of {rounds} "
              f"({100 * disturbed / rounds:.2f}%), in {disturbed_measurements} of {measurements} measurements")


if __name__ == "__main__":
    main()
