#!/usr/bin/env python3
"""The summary of a tools/bench/verdict_rate.sh run: for each step, the verdicts, their statuses and
the wall time, verdicts per minute and per GPU-minute; the ratios the goals table reports; the
identical-code pairs against the precision bar (reference time over candidate time, 1.00x within
+-2%); and where the two harnesses
disagree on correctness.

  tools/bench/rate_summary.py OUT [--json]

Reads OUT/walls.txt (a line a step: name, start and end in seconds, GPUs, exit status), OUT/STEP.jsonl
(the records), OUT/set/kinds.json (tools/bench/rate_set.py) and, where there is one, OUT/STEP.times
(crucible eval's stderr, each line stamped with the time it arrived). From the last: the first
verdict's time after the start, and the steady rate, verdicts per minute between the completions of
the 10% and the 90% verdicts (the start, the workers' and references' warm-up, and the last stragglers
with idle slots beside them left out).
"""
import argparse
import json
import os
import re
import sys


def records(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    print(f"rate_summary.py: {path}:{n}: not JSON, skipped", file=sys.stderr)
    return out


PROGRESS = re.compile(r"^(\d+(?:\.\d+)?) \[(\d+)/(\d+)\]")


def completions(path):
    """The times, in seconds since the epoch, at which stderr's progress lines said a verdict was done."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = PROGRESS.match(line)
            if m:
                out.append(float(m.group(1)))
    return sorted(out)


def steady(times):
    """Verdicts per minute between the completions of the 10% and the 90% verdicts, or None."""
    if len(times) < 10:
        return None
    lo, hi = len(times) // 10, len(times) - 1 - len(times) // 10
    span = times[hi] - times[lo]
    return (hi - lo) / span * 60.0 if span > 0 else None


def is_correct(r):
    if "correctness" in r:  # kernelbench_timing.py
        return bool(r.get("correctness"))
    return bool(r.get("correct"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the folder of a verdict_rate.sh run")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args()
    walls = {}
    try:
        with open(os.path.join(args.out, "walls.txt"), encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 5:
                    walls[parts[0]] = {"start": float(parts[1]), "wall_s": float(parts[2]) - float(parts[1]),
                                       "gpus": int(parts[3]), "rc": int(parts[4])}
    except OSError as e:
        sys.exit(f"rate_summary.py: {args.out}/walls.txt: {e.strerror}")
    try:
        with open(os.path.join(args.out, "set", "kinds.json"), encoding="utf-8") as f:
            kinds = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"rate_summary.py: {args.out}/set/kinds.json: {e}")
    steps = {}
    for name, w in walls.items():
        recs = records(os.path.join(args.out, name + ".jsonl"))
        set_name = "copies.jsonl" if name.startswith("warm") else "set.jsonl"
        kind = kinds.get(set_name, [])
        statuses = {}
        for r in recs:
            statuses[r.get("status", "?")] = statuses.get(r.get("status", "?"), 0) + 1
        n = len(recs)
        minutes = w["wall_s"] / 60.0
        step = dict(w, verdicts=n, statuses=statuses, per_min=n / minutes if minutes > 0 else None,
                    per_gpu_min=n / (minutes * w["gpus"]) if minutes > 0 else None)
        times = completions(os.path.join(args.out, name + ".times"))
        if times:
            step["first_verdict_s"] = times[0] - w["start"]
            step["steady_per_min"] = steady(times)
        # identical code: the precision bar
        selfs = [r for r in recs if 0 < r.get("line", 0) <= len(kind) and kind[r["line"] - 1] == "self"]
        if selfs:
            # The measured ratio, reference time over candidate time: crucible's `speedup` is the
            # credited one (1 for "no faster"), KernelBench's is this ratio already.
            def ratio(r):
                ref, cand = r.get("ref_ms"), r.get("cand_ms")
                return ref / cand if ref and cand else r.get("speedup")
            ratios = [ratio(r) for r in selfs]
            within = sum(1 for x in ratios if x is not None and abs(x - 1.0) <= 0.02)
            step["self"] = {"pairs": len(selfs), "within_2pct": within, "speedups": ratios}
        by_kind = {}
        for r in recs:
            if 0 < r.get("line", 0) <= len(kind):
                k = kind[r["line"] - 1]
                by_kind.setdefault(k, []).append(r.get("wall_s"))
        step["median_wall_s_by_kind"] = {
            k: sorted(x for x in v if x is not None)[len([x for x in v if x is not None]) // 2] if any(
                x is not None for x in v) else None for k, v in by_kind.items()}
        steps[name] = step
    ratios = {}
    if "kb" in steps and steps["kb"]["per_gpu_min"]:
        for name in ("cold", "cold2"):
            if name in steps and steps[name]["per_gpu_min"]:
                ratios[f"{name}/kb per GPU-minute"] = steps[name]["per_gpu_min"] / steps["kb"]["per_gpu_min"]
    warms = sorted((n for n in steps if re.fullmatch(r"warm[2-8]", n)), key=lambda n: int(n[4:]))
    for a, b in [(w, "warm1") for w in warms] + [("cold2", "cold")]:
        if a in steps and b in steps and steps[b]["per_min"]:
            ratios[f"{a}/{b} per minute"] = steps[a]["per_min"] / steps[b]["per_min"]
        if a in steps and b in steps and steps[a].get("steady_per_min") and steps[b].get("steady_per_min"):
            ratios[f"{a}/{b} steady per minute"] = steps[a]["steady_per_min"] / steps[b]["steady_per_min"]
    # Against linear: the rate on N GPUs over N times the rate on one (issue 88: at least 0.9).
    for w in warms:
        for kind in ("per minute", "steady per minute"):
            if f"{w}/warm1 {kind}" in ratios:
                ratios[f"{w}/warm1 {kind}, of linear"] = ratios[f"{w}/warm1 {kind}"] / int(w[4:])
    disagree = []
    if "kb" in steps and "cold" in steps:
        kb = {r.get("line"): r for r in records(os.path.join(args.out, "kb.jsonl"))}
        for r in records(os.path.join(args.out, "cold.jsonl")):
            k = kb.get(r.get("line"))
            if k is not None and is_correct(k) != is_correct(r):
                disagree.append({"line": r.get("line"), "task": r.get("task"), "kb": k.get("status"),
                                 "crucible": r.get("status"), "message": (r.get("message") or "")[:200]})
    result = {"steps": steps, "ratios": ratios, "correctness_disagreements": disagree}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{'step':6} {'GPUs':>4} {'verdicts':>8} {'wall s':>8} {'/min':>7} {'/GPU-min':>8}  statuses")
    for name, s in steps.items():
        print(f"{name:6} {s['gpus']:>4} {s['verdicts']:>8} {s['wall_s']:>8.1f} {s['per_min'] or 0:>7.2f} "
              f"{s['per_gpu_min'] or 0:>8.2f}  {json.dumps(s['statuses'])}  rc {s['rc']}")
        print(f"{'':6} median wall_s a verdict by kind: {json.dumps(s['median_wall_s_by_kind'])}")
        if "first_verdict_s" in s:
            rate = "-" if s["steady_per_min"] is None else f"{s['steady_per_min']:.2f}"
            print(f"{'':6} first verdict at {s['first_verdict_s']:.1f} s; steady rate (10% to 90% of the verdicts) "
                  f"{rate} /min")
        if "self" in s:
            sp = ", ".join("-" if x is None else f"{x:.3f}" for x in s["self"]["speedups"])
            print(f"{'':6} identical code: {s['self']['within_2pct']}/{s['self']['pairs']} within +-2% ({sp})")
    for k, v in ratios.items():
        print(f"ratio {k}: {v:.2f}x")
    for d in disagree:
        print(f"correctness differs, line {d['line']} {d['task']}: kb {d['kb']}, crucible {d['crucible']} "
              f"{d['message']!r}")


if __name__ == "__main__":
    main()
