#!/usr/bin/env python3
"""Lines for tools/bench/boundary_steps.sh's balance step (issue 88), from a run's own files.

  balance_lines.py sft RUN/metrics.jsonl    the SFT stage: its steps, first and last loss, median step
  balance_lines.py busy RUN/status.json     each GPU's busy shares: evaluations', the policy's, idle
"""
import json
import sys


def sft(path):
    steps = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line of a run in flight
            if r.get("event") == "train_step" and r.get("stage") == "sft":
                steps.append(r)
    if not steps:
        print(f"balance: no SFT step in {path}")
        return
    times = sorted(r.get("step_seconds", 0.0) for r in steps)
    print(f"balance: {len(steps)} SFT steps, loss {steps[0].get('loss', float('nan')):.3f} -> "
          f"{steps[-1].get('loss', float('nan')):.3f}, median step {times[len(times) // 2]:.2f} s")


def busy(path):
    with open(path, encoding="utf-8") as f:
        status = json.load(f)
    devices = status.get("devices") or []
    if not devices:
        print(f"  {path}: no devices (a CPU run)")
    for d in devices:
        s = d.get("seconds") or 0.0
        ev, pol = d.get("evaluation_s", 0.0), d.get("policy_s", 0.0)
        if s <= 0:
            print(f"  {d.get('device')}: no time yet")
            continue
        print(f"  {d.get('device')}: evaluations {ev / s:.1%}, policy {pol / s:.1%} of {s:.0f} s"
              f"{' (an evaluator)' if d.get('evaluator') else ''}")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("sft", "busy"):
        sys.exit(__doc__.strip())
    try:
        (sft if sys.argv[1] == "sft" else busy)(sys.argv[2])
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"balance_lines.py: {sys.argv[2]}: {e}")


if __name__ == "__main__":
    main()
