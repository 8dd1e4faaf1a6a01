#!/usr/bin/env python3
"""Actor-system overhead per learner step, from a run's metrics.jsonl.

For every step that trained, the coordinator's `step_timing` record holds the round trip of its
step request (sent to the trainer, reply received), and the trainer's `train_step` record splits
the trainer's side: `seconds` (the learner's update), `publish_seconds` (writing the new weights
and sending them to the engines), `wait_seconds` (waiting for rollout groups:
their generation, evaluation and delivery) and `prep_seconds` (building SFT examples). The rest
of the round trip is the actor system's share: the message hops coordinator -> trainer ->
learner -> trainer -> coordinator, mailbox and scheduling delays, and the trainer's bookkeeping.

    overhead = round_trip - seconds - publish_seconds - wait_seconds - prep_seconds

Usage: actor_overhead.py RUN_DIR [--json]
"""
import argparse
import json
import statistics
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): "
                                        "actor-system overhead <= 1% of a learner step, "
                                        "on the runs tools/bench/train_modes.sh makes. No environment variables.")
    ap.add_argument("run", type=Path)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    metrics = args.run / "metrics.jsonl"
    if not metrics.is_file():
        print(f"actor_overhead: {metrics} does not exist", file=sys.stderr)
        return 2
    steps, trips = {}, {}
    for n, line in enumerate(metrics.read_text().splitlines(), 1):
        try:
            e = json.loads(line)
        except json.JSONDecodeError as err:
            print(f"actor_overhead: {metrics}:{n}: not JSON ({err})", file=sys.stderr)
            return 2
        if e.get("event") == "train_step" and "step_seconds" in e:
            steps[e["step"]] = e
        elif e.get("event") == "step_timing":
            trips[e["step"]] = e["round_trip_seconds"]
    rows = []
    for step, e in sorted(steps.items()):
        if step not in trips:
            continue
        rt = trips[step]
        publish = e.get("publish_seconds", 0.0)
        work = e["seconds"] + publish + e["wait_seconds"] + e["prep_seconds"]
        rows.append({"step": step, "stage": e["stage"], "round_trip": rt, "learner": e["seconds"], "publish": publish,
                     "wait": e["wait_seconds"], "prep": e["prep_seconds"], "overhead": max(0.0, rt - work)})
    if not rows:
        print(f"actor_overhead: {metrics} has no steps with both train_step timings and step_timing",
              file=sys.stderr)
        return 2
    out = {"run": str(args.run), "stages": {}}
    for stage in dict.fromkeys(r["stage"] for r in rows):
        rs = [r for r in rows if r["stage"] == stage]
        shares = [r["overhead"] / r["round_trip"] for r in rs if r["round_trip"] > 0]
        total_rt = sum(r["round_trip"] for r in rs)
        out["stages"][stage] = {
            "steps": len(rs),
            "mean_step_s": total_rt / len(rs),
            "mean_learner_s": sum(r["learner"] for r in rs) / len(rs),
            "mean_publish_s": sum(r["publish"] for r in rs) / len(rs),
            "mean_wait_s": sum(r["wait"] for r in rs) / len(rs),
            "mean_prep_s": sum(r["prep"] for r in rs) / len(rs),
            "mean_overhead_ms": 1e3 * sum(r["overhead"] for r in rs) / len(rs),
            "overhead_share": sum(r["overhead"] for r in rs) / total_rt if total_rt > 0 else 0.0,
            "median_share": statistics.median(shares) if shares else 0.0,
            "max_share": max(shares) if shares else 0.0,
        }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{'stage':<16}{'steps':>6}{'step s':>9}{'learner s':>10}{'publish s':>10}{'wait s':>9}{'prep s':>9}"
          f"{'overhead ms':>12}{'share':>9}{'median':>9}{'max':>9}")
    for stage, s in out["stages"].items():
        print(f"{stage:<16}{s['steps']:>6}{s['mean_step_s']:>9.3f}{s['mean_learner_s']:>10.3f}{s['mean_publish_s']:>10.3f}"
              f"{s['mean_wait_s']:>9.3f}{s['mean_prep_s']:>9.3f}{s['mean_overhead_ms']:>12.3f}"
              f"{100 * s['overhead_share']:>8.3f}%{100 * s['median_share']:>8.3f}%{100 * s['max_share']:>8.3f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
