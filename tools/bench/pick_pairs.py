#!/usr/bin/env python3
"""Picks pairs out of a CUDA-L1 release (one JSON object a line: level_id, task_id, ref_code,
custom_code) into task and candidate files and a TSV for `crucible eval --pairs` and
tools/bench/kernelbench_timing.py, each pair repeated: the repeated verdicts of one kernel that
the timing precision goal is checked against (docs/PERFORMANCE.md, Timing precision).

  tools/bench/pick_pairs.py data/cuda-l1/3090.json --lines 114,53,109,151,36,40 --repeat 10 data/dev6

Writes OUT/tasks/L{level}_T{task}.py, OUT/candidates/L{level}_T{task}_r{k}.py (k = 1..repeat:
copies of one source, so that each repetition is a pair of its own in a set's records) and
OUT/pairs.tsv (every repetition) and OUT/pairs-1.tsv (the first of each). --lines are 1-based
line numbers of the release file, as `crucible eval --pairs` records them (`line`).
"""
import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): "
                                        "timing precision on small kernels (the pairs of "
                                        "data/dev6). No environment variables.")
    ap.add_argument("release", help="a CUDA-L1 optimized_cuda_code/*.json file")
    ap.add_argument("out", help="folder for the tasks, candidates and TSVs")
    ap.add_argument("--lines", required=True, help="comma-separated 1-based line numbers")
    ap.add_argument("--repeat", type=int, default=1, help="copies of each pair (1)")
    args = ap.parse_args()
    try:
        wanted = [int(x) for x in args.lines.split(",") if x.strip()]
    except ValueError:
        sys.exit(f"--lines {args.lines!r}: not a comma-separated list of line numbers")
    if args.repeat < 1:
        sys.exit("--repeat must be at least 1")
    with open(args.release, encoding="utf-8") as f:
        lines = f.read().split("\n")
    os.makedirs(os.path.join(args.out, "tasks"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "candidates"), exist_ok=True)
    every, first = [], []
    for n in wanted:
        if n < 1 or n > len(lines) or not lines[n - 1].strip():
            sys.exit(f"{args.release}: no record on line {n}")
        try:
            rec = json.loads(lines[n - 1])
        except json.JSONDecodeError as e:
            sys.exit(f"{args.release}:{n}: not JSON ({e})")
        ref, cand = rec.get("ref_code"), rec.get("custom_code")
        if not isinstance(ref, str) or not isinstance(cand, str) or cand.strip() in ("", "None"):
            sys.exit(f"{args.release}:{n}: no ref_code or custom_code")
        name = f"L{rec.get('level_id')}_T{rec.get('task_id')}"
        task = os.path.join("tasks", name + ".py")
        with open(os.path.join(args.out, task), "w", encoding="utf-8") as f:
            f.write(ref)
        for k in range(1, args.repeat + 1):
            c = os.path.join("candidates", f"{name}_r{k}.py")
            with open(os.path.join(args.out, c), "w", encoding="utf-8") as f:
                f.write(cand)
            every.append(f"{task}\t{c}\n")
            if k == 1:
                first.append(f"{task}\t{c}\n")
    for fname, rows in (("pairs.tsv", every), ("pairs-1.tsv", first)):
        with open(os.path.join(args.out, fname), "w", encoding="utf-8") as f:
            f.write(f"# {len(rows)} pairs from {os.path.basename(args.release)} lines {args.lines}\n")
            f.writelines(rows)
    print(f"{len(wanted)} pairs x {args.repeat}: {args.out}/pairs.tsv, {args.out}/pairs-1.tsv")


if __name__ == "__main__":
    main()
