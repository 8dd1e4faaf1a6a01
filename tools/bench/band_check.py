#!/usr/bin/env python3
"""Repeated verdicts of one kernel against their own bands: how far apart the verdicts lie, and
whether each verdict's band covers the others' speedups. What the timing precision goal of
docs/PERFORMANCE.md is checked with (issue 41: repeated verdicts spread at most 2% and each band
covering the others; the reference as its own candidate at 1.00x within 2% and never credited).

  tools/bench/band_check.py data/runs/precision/dev6.jsonl
  tools/bench/band_check.py data/runs/precision/self-l1.jsonl --self
  tools/bench/band_check.py data/runs/precision/dev6.jsonl --calibrate 0.95

Reads the records of `crucible eval --pairs ... --out` (or `--json --repeat N` output, one object a
line) and groups them by task and candidate source file name with its `_rN` repetition suffix
taken off (tools/bench/pick_pairs.py writes the copies of one kernel as NAME_r1.py ... NAME_rN.py).
Uses the verdict's measured speedup (the figure in its message, which its band is around; the
credited `speedup` caps it at 1.00 where the band does not clear the win threshold).

Per group: n verdicts, the measured speedups' median, their spread ((max - min) / median), the
widest band, and coverage: the share of ordered pairs (a, b) whose measured speedups differ by at
most a's band (relative half-width, `speedup_spread`). With --self (the reference as its own
candidate) each verdict is one group of its own: |speedup - 1| against 2% and the band, and any
credited speedup above 1.00 is listed. --calibrate COVERAGE prints the smallest
evaluator.band_floor under which that share of all ordered pairs is covered, from records made
with evaluator.band_floor=0.

Exit 0; --json prints one object.
"""
import argparse
import json
import math
import os
import re
import statistics
import sys

_REPEAT = re.compile(r"_r\d+(\.py)?$")


def read(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                sys.exit(f"{path}:{n}: not a JSON record")
    return out


_SPEEDUP = re.compile(r"(\d+(?:\.\d+)?)x over \d+ paired rounds")


def measured(r):
    """The verdict's own measured speedup (the median of its bucket means, which its band is
    around), from its message ("faster: 1.552x over 20 paired rounds ..."); ref_ms / cand_ms (the
    ratio of the medians, which can differ from it by a percent) where the message lacks it."""
    ref, cand = r.get("ref_ms"), r.get("cand_ms")
    if r.get("status") != "ok" or not isinstance(ref, (int, float)) or not isinstance(cand, (int, float)) or cand <= 0:
        return None
    m = _SPEEDUP.search(str(r.get("message", "")))
    return float(m.group(1)) if m else ref / cand


def coverage(ok, floor=0.0):
    """The share of ordered pairs (a, b) of (speedup, band) whose speedups differ by at most a's
    band, widened by `floor` in quadrature (evaluator.band_floor)."""
    pairs = covered = 0
    for i, (a, ba) in enumerate(ok):
        for j, (b, _) in enumerate(ok):
            if i != j:
                pairs += 1
                covered += abs(a - b) <= math.hypot(ba, floor) * a
    return covered / pairs if pairs else None


def calibrate(records, target):
    """The smallest evaluator.band_floor (in steps of 0.05%) under which `target` of all ordered
    pairs of repeated verdicts, over every group, are covered: run on records made with
    evaluator.band_floor=0."""
    oks = []
    for rs in grouped(records).values():
        oks.append([(measured(r), r["speedup_spread"]) for r in rs
                    if measured(r) is not None and isinstance(r.get("speedup_spread"), (int, float))])
    for step in range(0, 401):
        floor = step * 0.0005
        pairs = covered = 0
        for ok in oks:
            n = len(ok) * (len(ok) - 1)
            c = coverage(ok, floor)
            if c is not None:
                pairs += n
                covered += c * n
        if pairs and covered / pairs >= target:
            return floor, covered / pairs
    return None, None


def key(r):
    cand = os.path.basename(str(r.get("candidate", "")))
    cand = _REPEAT.sub("", cand[:-3] if cand.endswith(".py") else cand)
    task = str(r.get("task", ""))
    return f"{os.path.basename(task)} / {cand}" if cand else os.path.basename(task)


def grouped(records):
    by = {}
    for r in records:
        by.setdefault(key(r), []).append(r)
    return by


def groups(records):
    rows = []
    for name, rs in sorted(grouped(records).items()):
        sp = [(measured(r), r.get("speedup_spread")) for r in rs]
        ok = [(s, b) for s, b in sp if s is not None and isinstance(b, (int, float))]
        row = {"group": name, "n": len(rs), "ok": len(ok),
               "statuses": sorted({r.get("status") for r in rs}),
               "wall_s_median": statistics.median([r["wall_s"] for r in rs if isinstance(r.get("wall_s"), (int, float))] or [0])}
        if ok:
            s = [x for x, _ in ok]
            med = statistics.median(s)
            row.update({"median": med, "spread": (max(s) - min(s)) / med, "widest_band": max(b for _, b in ok),
                        "cand_ms_median": statistics.median([r["cand_ms"] for r in rs if measured(r) is not None])})
            row["coverage"] = coverage(ok)
        rows.append(row)
    return rows


def self_rows(records):
    rows = []
    for r in records:
        s = measured(r)
        rows.append({"task": os.path.basename(str(r.get("task", ""))), "status": r.get("status"), "measured": s,
                     "band": r.get("speedup_spread"), "credited": r.get("speedup"),
                     "within_2pct": s is not None and abs(s - 1.0) <= 0.02,
                     "band_within_2pct": isinstance(r.get("speedup_spread"), (int, float)) and r["speedup_spread"] <= 0.02,
                     "credited_faster": isinstance(r.get("speedup"), (int, float)) and r["speedup"] > 1.0,
                     "cand_ms": r.get("cand_ms"), "wall_s": r.get("wall_s"), "message": r.get("message", "")})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): "
                                        "timing precision on small kernels, from the records "
                                        "of tools/bench/gpu_session.sh timing. No environment variables.")
    ap.add_argument("records", help="crucible eval records, one JSON object a line")
    ap.add_argument("--self", action="store_true", help="the reference as its own candidate: each verdict against 1.00")
    ap.add_argument("--calibrate", type=float, metavar="COVERAGE",
                    help="print the smallest evaluator.band_floor under which this share (0.95) of ordered pairs of "
                         "repeated verdicts is covered (records made with evaluator.band_floor=0)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    recs = read(args.records)
    if args.calibrate is not None:
        floor, got = calibrate(recs, args.calibrate)
        print(json.dumps({"band_floor": floor, "coverage": got, "target": args.calibrate}))
        return
    if args.self:
        rows = self_rows(recs)
        summary = {"verdicts": len(rows), "ok": sum(r["status"] == "ok" for r in rows),
                   "within_2pct": sum(r["within_2pct"] for r in rows),
                   "band_within_2pct": sum(r["band_within_2pct"] for r in rows),
                   "credited_faster": [r["task"] for r in rows if r["credited_faster"]],
                   "wall_s_median": statistics.median([r["wall_s"] for r in rows if isinstance(r["wall_s"], (int, float))] or [0])}
        if args.json:
            print(json.dumps({"summary": summary, "rows": rows}))
            return
        for r in rows:
            if not (r["within_2pct"] and r["band_within_2pct"]) or r["credited_faster"]:
                m = f"{r['measured']:.3f}x" if r["measured"] is not None else "-"
                b = f"±{100 * r['band']:.1f}%" if isinstance(r["band"], (int, float)) else "-"
                print(f"{r['task']:<48} {r['status']:<13} {m:>8} {b:>8}  {r['message'][:90]}")
        print(json.dumps(summary))
        return
    rows = groups(recs)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'group':<44} {'n':>3} {'ok':>3} {'median':>8} {'spread':>7} {'band<=':>7} {'cover':>6} {'cand us':>8} {'wall s':>7}")
    for r in rows:
        if "median" not in r:
            print(f"{r['group'][:44]:<44} {r['n']:>3} {r['ok']:>3}  statuses {r['statuses']}")
            continue
        print(f"{r['group'][:44]:<44} {r['n']:>3} {r['ok']:>3} {r['median']:>7.3f}x {100 * r['spread']:>6.2f}% "
              f"{100 * r['widest_band']:>6.2f}% {100 * (r['coverage'] or 0):>5.0f}% {1e3 * r['cand_ms_median']:>8.1f} "
              f"{r['wall_s_median']:>7.1f}")


if __name__ == "__main__":
    main()
