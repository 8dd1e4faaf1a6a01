#!/usr/bin/env python3
"""KernelBench level 1's bounds table (docs/bounds-kernelbench-l1.md) with CUDA-L1's kernels beside
it: for each task, the verdict its kernel got here (`crucible eval --pairs` records of
`tools/bench/rate_set.py RELEASE OUT --level 1`), its speedup, its fraction of the task's bound on
this hardware, its reference's fraction in the same verdict, and the speedup the release gives for
it (CUDA-L1's own figure on its hardware). CUDA-L1's tasks are KernelBench's earlier versions, most
with smaller inputs than the table's: a verdict's bound is its own task's, shown beside the table's,
and the kernel's fraction is to be read against its own reference's, not the table's.

  tools/bench/bounds_table.py docs/bounds-kernelbench-l1.md RECORDS.jsonl > bounds.md

Prints the table's Markdown with six columns added to its task rows (a task without a record gets
"-"); a table that has them already (this script's own output) keeps a row's cells where RECORDS
has no record of its task and fills them where it has (the records of a second run, of the tasks a
first did not reach), then, to standard error, a summary: records matched, ok verdicts, the highest fraction among
them, and every kernel above 1.0 of its bound (none is expected: docs/evaluator.md, How far from the
limit). Exit 2 for a file that cannot be read or a table without task rows.
"""
import json
import re
import sys

ADDED = ["CUDA-L1 kernel here", "its speedup", "its bound (ms)", "its fraction", "its reference's fraction",
         "CUDA-L1's figure"]


def records(path):
    """Task number -> record, from one JSON record a line (the last record of a task wins)."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"bounds_table.py: {path}:{n}: not JSON ({e.msg})")
            task = r.get("task_id")
            if not isinstance(task, int):
                m = re.search(r"(\d+)$", str(r.get("task", "")))
                task = int(m.group(1)) if m else None
            if task is not None and r.get("level_id", 1) == 1:
                out[task] = r
    return out


def cell(x, fmt):
    return fmt.format(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"


def main():
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0 if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help") else 2)
    table, recs_path = sys.argv[1], sys.argv[2]
    try:
        lines = open(table, encoding="utf-8").read().split("\n")
        recs = records(recs_path)
    except OSError as e:
        sys.exit(f"bounds_table.py: {e.filename}: {e.strerror}")
    out, rows, matched, ok, above, best = [], 0, 0, 0, [], None

    def tally(task, status, frac):
        """Counts one row that has a verdict (a record's, or the cells a filled table kept)."""
        nonlocal matched, ok, best
        matched += 1
        if status == "ok":
            ok += 1
            if isinstance(frac, (int, float)):
                best = frac if best is None else max(best, frac)
                if frac > 1.0:
                    above.append(f"{task} ({frac:.3f})")

    # A table with the columns already: each task row's own six last cells, replaced where a record is.
    filled = any(line.startswith("| task |") and ADDED[0] in line for line in lines)
    for line in lines:
        m = re.match(r"\| (\d+)_", line)
        if line.startswith("| task |"):
            if not filled:
                line += " " + " | ".join(ADDED) + " |"
        elif line.startswith("|---"):
            if not filled:
                line += "---|---:|---:|---:|---:|---:|"
        elif m:
            rows += 1
            r = recs.get(int(m.group(1)))
            if filled:
                cells = line.split(" | ")
                if len(cells) < 7 + len(ADDED) - 1:
                    sys.exit(f"bounds_table.py: {table}: task {m.group(1)}'s row has fewer cells than its header")
                kept = [c.strip(" |") for c in cells[-len(ADDED):]]
                line = " | ".join(cells[:-len(ADDED)]) + " |"
                if r is None:
                    line += " " + " | ".join(kept) + " |"
                    if kept[0] != "-":
                        fm = re.match(r"([0-9.]+)", kept[3])
                        tally(m.group(1), kept[0], float(fm.group(1)) if fm else None)
                    out.append(line)
                    continue
            if r is None:
                line += " - | - | - | - | - | - |"
            else:
                status = r.get("status", "-")
                frac = r.get("fraction") if status == "ok" else None
                tally(m.group(1), status, frac)
                claimed = (r.get("input") or {}).get("score_default")
                # A bound whose FLOP part counts the reference's own algorithm gives the fraction of
                # its bytes part (docs/evaluator.md, How far from the limit).
                of = " (bytes part)" if frac is not None and r.get("fraction_of") == "bytes_ms" else ""
                # The bound the fraction is of: its bytes part where the fraction is of that part.
                bound = (r.get("bound") or {}).get(r.get("fraction_of") or "ms") if status == "ok" else None
                ref = r.get("ref_fraction") if status == "ok" else None
                line += (f" {status} | {cell(r.get('speedup') if status == 'ok' else None, '{:.2f}x')} | "
                         f"{cell(bound, '{:.3g}')} | {cell(frac, '{:.3f}')}{of} | {cell(ref, '{:.3f}')} | "
                         f"{cell(claimed, '{:.2f}x')} |")
        out.append(line)
    if rows == 0:
        sys.exit(f"bounds_table.py: {table}: no task rows ('| N_name | ...')")
    sys.stdout.write("\n".join(out).rstrip("\n") + "\n")
    print(f"bounds_table.py: {matched} of {rows} tasks with a record, {ok} ok; highest fraction of an ok "
          f"kernel {cell(best, '{:.3f}')}; above 1.0: {', '.join(above) if above else 'none'}", file=sys.stderr)


if __name__ == "__main__":
    main()
