#!/usr/bin/env python3
"""A kernel set of tasks judged against themselves: for every task file in a folder (a KernelBench
level, a crucible suite), a candidate that is the task's own source with `Model` renamed
`ModelNew` (the class and every use of its name), and a TSV of the pairs for `crucible eval --pairs`. Identical code must come out `ok`
at 1.00x within its band and never credited as faster: what the evaluator's timing precision is
checked against (docs/PERFORMANCE.md, Timing precision).

  tools/bench/reference_as_candidate.py data/kernelbench/level1 /tmp/self-l1
  crucible eval --pairs /tmp/self-l1/pairs.tsv --device cuda:0 --out self-l1.jsonl

Writes OUT/candidates/NAME.py and OUT/pairs.tsv (absolute task paths, candidate paths relative to
OUT); files that are not tasks (no `class Model`, `get_inputs`, `get_init_inputs`) are skipped and
named on stderr. --limit N keeps the first N tasks by their leading number.
"""
import argparse
import os
import re
import sys

_MODEL = re.compile(r"^class Model\b", re.M)
_NAME = re.compile(r"\bModel\b")  # the class and its uses (`super(Model, self)`)


def number(name):
    m = re.match(r"(\d+)_", name)
    return (int(m.group(1)) if m else 1 << 30, name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): "
                                        "timing precision on small kernels (the self-l1 "
                                        "step of tools/bench/gpu_session.sh timing). No environment variables.")
    ap.add_argument("tasks", help="folder of task files")
    ap.add_argument("out", help="folder for the candidates and pairs.tsv")
    ap.add_argument("--limit", type=int, default=0)
    a = ap.parse_args()
    names = sorted((f for f in os.listdir(a.tasks) if f.endswith(".py")), key=number)
    os.makedirs(os.path.join(a.out, "candidates"), exist_ok=True)
    rows = []
    for name in names:
        path = os.path.abspath(os.path.join(a.tasks, name))
        src = open(path, encoding="utf-8").read()
        if not (_MODEL.search(src) and "def get_inputs" in src and "def get_init_inputs" in src):
            print(f"reference_as_candidate: {path}: not a task, skipped", file=sys.stderr)
            continue
        cand = os.path.join("candidates", name)
        with open(os.path.join(a.out, cand), "w", encoding="utf-8") as f:
            f.write(_NAME.sub("ModelNew", src))
        rows.append(f"{path}\t{cand}\n")
        if a.limit and len(rows) == a.limit:
            break
    with open(os.path.join(a.out, "pairs.tsv"), "w", encoding="utf-8") as f:
        f.write("# task\treference as the candidate (tools/bench/reference_as_candidate.py)\n")
        f.writelines(rows)
    print(f"reference_as_candidate: {len(rows)} pairs in {os.path.join(a.out, 'pairs.tsv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
