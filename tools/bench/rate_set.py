#!/usr/bin/env python3
"""A set of pairs out of a CUDA-L1 release for verdicts per GPU-minute (tools/bench/verdict_rate.sh):
PyTorch-only candidates, `load_inline` candidates and identical code (the task's reference as
`ModelNew`), in CUDA-L1's JSONL layout, which both `crucible eval --pairs` and
tools/bench/kernelbench_timing.py read.

  tools/bench/rate_set.py data/cuda-l1/h100.json OUT --torch 8 --inline 4 --self 4 --copies 4
  tools/bench/rate_set.py data/cuda-l1/h100.json OUT --torch 18 --inline 6 --self 6 --copies 1 \
      --also data/cuda-l1/3090.json:1/12 --also data/cuda-l1/3090.json:1/40   (the 32-pair set)

  tools/bench/rate_set.py data/cuda-l1/h100.json OUT --level 1 --copies 1
      (every pair of level 1 with a candidate, in task order: the kernels beside their tasks'
      bounds, tools/bench/bounds_table.py)

Takes levels 1 and 2 only (with --level, that level alone). Candidates are picked evenly spread over the release's lines of each
kind (the first, then every k-th), so a run of the same arguments picks the same pairs. Identical
code comes from the tasks of the first --self PyTorch-only picks. Writes:
  OUT/set.jsonl     each pair once (the release's fields; custom_code replaced for identical code,
                    whose `kind` is "self")
  OUT/copies.jsonl  the same pairs --copies times, each copy's candidate made distinct by a trailing
                    comment (its extension sources unchanged, so a build made for one copy serves
                    the others)
  OUT/kinds.json    the kind of every line of both files ("torch", "inline" or "self")
"""
import argparse
import json
import os
import re
import sys


def kind_of(code):
    if "load_inline" in code or "cpp_extension" in code:
        return "inline"
    if "triton" in code:
        return "triton"
    return "torch"


def spread(rows, n):
    if n <= 0 or not rows:
        return []
    if n >= len(rows):
        return rows
    step = len(rows) / n
    return [rows[int(i * step)] for i in range(n)]


def release_rows(path, where=""):
    """The JSON objects of a release file, one a line; exits naming the file (after `where`) and
    the line where it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError as e:
        sys.exit(f"rate_set.py: {where}{path}: {e.strerror}")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"rate_set.py: {path}:{n}: not JSON ({e.msg})")
        if not isinstance(row, dict):
            sys.exit(f"rate_set.py: {path}:{n}: a JSON {type(row).__name__}, expected one object a line")
        yield row


def also_pair(spec):
    """(kind, row) of RELEASE:LEVEL/TASK, its `name` saying where it came from."""
    m = re.fullmatch(r"(.+):(\d+)/(\d+)", spec)
    if not m:
        sys.exit(f"rate_set.py: --also {spec}: expected RELEASE:LEVEL/TASK, e.g. data/cuda-l1/3090.json:1/12")
    path, level, task = m.group(1), int(m.group(2)), int(m.group(3))
    for row in release_rows(path, f"--also {spec}: "):
        if row.get("level_id") == level and row.get("task_id") == task:
            code = row.get("custom_code")
            if not isinstance(code, str) or code in ("", "None"):
                sys.exit(f"rate_set.py: --also {spec}: that pair has no candidate")
            name = f"L{level}_T{task} (CUDA-L1 {os.path.splitext(os.path.basename(path))[0]} release)"
            return kind_of(code), dict(row, name=name)
    sys.exit(f"rate_set.py: --also {spec}: no pair of level {level}, task {task} in {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): verdicts per "
                                        "GPU-minute against KernelBench's harness, with "
                                        "tools/bench/verdict_rate.sh. No environment variables.")
    ap.add_argument("release", help="a CUDA-L1 optimized_cuda_code/*.json file (one JSON object a line)")
    ap.add_argument("out", help="folder for set.jsonl, copies.jsonl and kinds.json")
    ap.add_argument("--torch", type=int, default=8, help="PyTorch-only candidates (8)")
    ap.add_argument("--inline", type=int, default=4, help="load_inline candidates (4)")
    ap.add_argument("--self", type=int, default=4, dest="self_", help="identical-code pairs (4)")
    ap.add_argument("--copies", type=int, default=4, help="copies of the set in copies.jsonl (4)")
    ap.add_argument("--level", type=int, default=0,
                    help="every pair of this level with a candidate, in task order, instead of the picks "
                         "(--torch, --inline and --self are then left aside)")
    ap.add_argument("--also", action="append", default=[], metavar="RELEASE:LEVEL/TASK",
                    help="a pair of another release added at the end, by level and task (e.g. "
                         "data/cuda-l1/3090.json:1/12); repeatable; its kind as the pairs' above")
    args = ap.parse_args()
    if min(args.torch, args.inline, args.self_) < 0 or args.copies < 1:
        sys.exit("rate_set.py: --torch, --inline and --self must be at least 0, --copies at least 1")
    if args.self_ > args.torch:
        sys.exit("rate_set.py: --self takes the tasks of PyTorch-only picks, so it may not exceed --torch")
    if args.level:
        rows = [r for r in release_rows(args.release) if r.get("level_id") == args.level
                and isinstance(r.get("custom_code"), str) and r["custom_code"] not in ("", "None")]
        if not rows:
            sys.exit(f"rate_set.py: {args.release} has no pair of level {args.level} with a candidate")
        rows.sort(key=lambda r: r.get("task_id") if isinstance(r.get("task_id"), int) else 0)
        write_set(args, [(kind_of(r["custom_code"]), r) for r in rows] + [also_pair(a) for a in args.also])
        return
    by_kind = {"torch": [], "inline": []}
    for row in release_rows(args.release):
        code = row.get("custom_code")
        if row.get("level_id") not in (1, 2) or not isinstance(code, str) or code in ("", "None"):
            continue
        k = kind_of(code)
        if k in by_kind:
            by_kind[k].append(row)
    picked = [("torch", r) for r in spread(by_kind["torch"], args.torch)]
    picked += [("inline", r) for r in spread(by_kind["inline"], args.inline)]
    for kind, want in (("torch", args.torch), ("inline", args.inline)):
        if len(by_kind[kind]) < want:
            sys.exit(f"rate_set.py: {args.release} has {len(by_kind[kind])} {kind} candidates of levels 1-2, "
                     f"fewer than the {want} asked for")
    for _, r in picked[:args.self_]:
        s = dict(r)
        s["custom_code"] = re.sub(r"\bModel\b", "ModelNew", r["ref_code"])
        picked.append(("self", s))
    for spec in args.also:
        picked.append(also_pair(spec))
    write_set(args, picked)


def write_set(args, picked):
    """set.jsonl, copies.jsonl and kinds.json of the (kind, row) pairs `picked` in args.out."""
    os.makedirs(args.out, exist_ok=True)
    kinds = {"set.jsonl": [], "copies.jsonl": []}
    with open(os.path.join(args.out, "set.jsonl"), "w", encoding="utf-8") as f:
        for kind, r in picked:
            f.write(json.dumps(dict(r, kind=kind)) + "\n")
            kinds["set.jsonl"].append(kind)
    with open(os.path.join(args.out, "copies.jsonl"), "w", encoding="utf-8") as f:
        for c in range(args.copies):
            for kind, r in picked:
                f.write(json.dumps(dict(r, kind=kind, custom_code=r["custom_code"] + f"\n# copy {c + 1}\n")) + "\n")
                kinds["copies.jsonl"].append(kind)
    with open(os.path.join(args.out, "kinds.json"), "w", encoding="utf-8") as f:
        json.dump(kinds, f)
    counts = {k: sum(1 for x, _ in picked if x == k) for k in ("torch", "inline", "triton", "self")}
    print(f"rate_set.py: {len(picked)} pairs ({counts['torch']} torch, {counts['inline']} inline, "
          + (f"{counts['triton']} triton, " if counts["triton"] else "")
          + f"{counts['self']} self), {len(picked) * args.copies} in copies.jsonl, in {args.out}")


if __name__ == "__main__":
    main()
