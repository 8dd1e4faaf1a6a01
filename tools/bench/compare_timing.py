#!/usr/bin/env python3
"""Crucible's verdicts beside KernelBench's harness on the same pairs: every pair where the two
disagree, with both numbers, and the counts.

Joins the records of `crucible eval --pairs SET --out crucible.jsonl` with those of
`tools/bench/kernelbench_timing.py --pairs SET --out kb.jsonl` (the same SET file): by `line` for a
CUDA-L1 JSONL set, by task and candidate path for a TSV set (normalised; then by the real path,
then by `line`, when the two ran from different folders).

A pair disagrees
  in status   when one side passes it and the other does not: crucible `ok` against KernelBench
              incorrect (or any other failure), or KernelBench correct against any crucible status
              but `ok` (`rejected` with a KernelBench speedup of 1.01x or more: refused vs credited);
  in speedup  when both pass it and KernelBench's speedup differs from crucible's by more than the
              larger of crucible's band (`speedup_spread`, a relative half-width) and --min-rel
              (5%), relative to crucible's speedup;
  in credit   when both pass it within that margin, but only one counts as a win: a speedup of
              1.01x or more (fast_1.0 with speedups rounded toward 1.00 to two decimals, as both
              crucible's summary and its win_threshold count).
Pairs that both fail (whatever the two statuses) agree; the status matrix counts them.

Each row names what the records say about it: for a status disagreement the failing side's
message (crucible's checks_failed and message, KernelBench's error); for a speedup disagreement the
ratio of the two sides' reference times and of their candidate times (KernelBench / crucible:
which of the two measurements moved), KernelBench's relative std of each, crucible's band, and
crucible's own-work cap (a 1.00x credited for a candidate that ran the reference's kernels) or
KernelBench's excessive-speedup flag where set.

  tools/bench/compare_timing.py crucible.jsonl kb.jsonl
  tools/bench/compare_timing.py crucible.jsonl kb.jsonl --kb-speedup eval --json

--kb-speedup picks KernelBench's speedup: `run_and_check` (default: the reference timed by
measure_ref_program_time, as scripts/run_and_check.py does) or `eval` (the reference as
eval_kernel_against_ref times it for its excessive-speedup check). Exit 0, or 2 for unreadable input.
"""
import argparse
import json
import math
import os
import re
import sys

WIN = 1.01


def read_jsonl(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                print(f"{path}:{n}: not JSON ({e})", file=sys.stderr)
                sys.exit(2)
    return out


def is_jsonl_record(r):
    return r.get("form") == "jsonl" or "level_id" in r


def keys(r):
    """Join keys of a record, most exact first."""
    if is_jsonl_record(r):
        return [("line", r.get("line"))]
    task, cand = str(r.get("task")), str(r.get("candidate"))
    out = [("path", os.path.normpath(task), os.path.normpath(cand)),
           ("real", os.path.realpath(task), os.path.realpath(cand))]
    if r.get("line") is not None and r.get("task") is None:
        # A line number joins only records without paths: two pair files of one set (all of it,
        # and a part) number their lines differently.
        out.append(("line", r.get("line")))
    return out


def credited(speedup):
    return speedup is not None and math.floor(speedup * 100 + 1e-9) / 100 >= WIN


def measured_speedup(cr):
    """The speedup crucible measured, before its own-work cap (from its message)."""
    m = re.search(r"([0-9.]+)x over \d+ paired rounds", cr.get("message") or "")
    return float(m.group(1)) if m else cr.get("speedup")


def short(text, n=150):
    text = " ".join(str(text or "").split())
    return text if len(text) <= n else text[: n - 3] + "..."


def kb_status(kb):
    if kb.get("correctness"):
        return "correct"
    return kb.get("status") or ("incorrect" if kb.get("compiled") else "compile_error")


def compare(cr, kb, min_rel, which):
    """The disagreement of one joined pair, or None when they agree."""
    cr_ok = cr.get("status") == "ok"
    kb_ok = bool(kb.get("correctness"))
    kb_sp = kb.get("speedup") if which == "run_and_check" else kb.get("speedup_eval")
    kb_ref = kb.get("ref_ms") if which == "run_and_check" else kb.get("eval_ref_ms")
    kb_ref_std = kb.get("ref_std") if which == "run_and_check" else kb.get("eval_ref_std")
    cr_sp = cr.get("speedup")
    row = {"pair": cr.get("pair"), "line": cr.get("line"), "task": cr.get("task"), "candidate": cr.get("candidate"),
           "form": "jsonl" if is_jsonl_record(cr) else "tsv",
           "crucible_status": cr.get("status"), "crucible_speedup": cr_sp,
           "crucible_spread": cr.get("speedup_spread"), "crucible_ref_ms": cr.get("ref_ms"),
           "crucible_cand_ms": cr.get("cand_ms"), "crucible_checks_failed": cr.get("checks_failed") or [],
           "crucible_message": cr.get("message"),
           "kb_status": kb_status(kb), "kb_speedup": kb_sp, "kb_ref_ms": kb_ref, "kb_ref_std": kb_ref_std,
           "kb_cand_ms": kb.get("cand_ms"), "kb_cand_std": kb.get("cand_std"), "kb_error": kb.get("error"),
           "kb_excessive_speedup": kb.get("excessive_speedup")}
    if cr_ok and not kb_ok:
        row["kind"] = "status"
        row["what"] = row["category"] = f"crucible ok, KernelBench {row['kb_status']}"
        row["note"] = "KernelBench: " + short(kb.get("error"))
        return row
    if kb_ok and not cr_ok:
        row["kind"] = "status"
        if cr.get("status") == "rejected" and credited(kb_sp):
            row["what"] = row["category"] = "refused by crucible, credited by KernelBench"
        else:
            row["what"] = row["category"] = f"KernelBench correct, crucible {cr.get('status')}"
        checks = ",".join(row["crucible_checks_failed"])
        row["note"] = "crucible: " + (f"[{checks}] " if checks else "") + short(cr.get("message"))
        return row
    if not (cr_ok and kb_ok):
        return None
    if kb_sp is None or cr_sp is None:
        row["kind"] = "speedup"
        row["what"] = row["category"] = ("KernelBench correct without a speedup" if kb_sp is None
                                         else "crucible ok without a speedup")
        row["note"] = short(kb.get("error") if kb_sp is None else cr.get("message"))
        return row
    tol = max(cr.get("speedup_spread") or 0.0, min_rel)
    rel = kb_sp / cr_sp - 1 if cr_sp > 0 else math.inf
    row["relative_difference"], row["tolerance"] = rel, tol
    notes = []
    if cr.get("ref_ms") and kb_ref and cr.get("cand_ms") and kb.get("cand_ms"):
        notes.append(f"KB/crucible ref x{kb_ref / cr['ref_ms']:.2f}, cand x{kb['cand_ms'] / cr['cand_ms']:.2f}")
    if kb_ref and kb_ref_std is not None and kb.get("cand_ms") and kb.get("cand_std") is not None:
        notes.append(f"KB std ref {100 * kb_ref_std / kb_ref:.0f}%, cand {100 * kb['cand_std'] / kb['cand_ms']:.0f}%")
    if "no speed credit" in (cr.get("message") or ""):
        notes.append(f"crucible capped at 1.00x for running the reference's kernels (measured "
                     f"{measured_speedup(cr):.3f}x)")
    if kb.get("excessive_speedup"):
        notes.append("KernelBench flags an excessive speedup (>10x)")
    row["note"] = "; ".join(notes)
    if abs(rel) > tol:
        row["kind"] = "speedup"
        row["what"] = f"KB/crucible {kb_sp / cr_sp:.2f} beyond ±{100 * tol:.1f}%"
        row["category"] = "speedup: KernelBench higher" if rel > 0 else "speedup: KernelBench lower"
        return row
    if credited(cr_sp) != credited(kb_sp):
        row["kind"] = "credit"
        row["category"] = ("crucible credits, KernelBench does not" if credited(cr_sp)
                           else "KernelBench credits, crucible does not")
        row["what"] = row["category"] + f" (within ±{100 * tol:.1f}%)"
        return row
    return None


def fmt_speedup(sp, spread=None):
    if sp is None:
        return "-"
    return f"{sp:.3f}x" + (f" ±{100 * spread:.0f}%" if spread is not None else "")


def label(r):
    if is_jsonl_record(r):
        return f"{r.get('task')} (line {r.get('line')})"
    task = os.path.splitext(os.path.basename(str(r.get("task"))))[0]
    return f"{task}: {os.path.basename(str(r.get('candidate')))}"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): "
                                        "timing precision on small kernels, KernelBench's\n"
                                        "timing beside crucible's (the kb-* steps of tools/bench/gpu_session.sh timing).\n"
                                        "No environment variables.")
    ap.add_argument("crucible", help="crucible eval --pairs ... --out records")
    ap.add_argument("kernelbench", help="tools/bench/kernelbench_timing.py --out records")
    ap.add_argument("--min-rel", type=float, default=0.05, help="least relative speedup difference listed (0.05)")
    ap.add_argument("--kb-speedup", choices=["run_and_check", "eval"], default="run_and_check")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    for p in (args.crucible, args.kernelbench):
        if not os.path.exists(p):
            print(f"{p}: no such file", file=sys.stderr)
            return 2
    crs, kbs = read_jsonl(args.crucible), read_jsonl(args.kernelbench)

    index = {}
    for i, kb in enumerate(kbs):
        for k in keys(kb):
            index.setdefault(k, i)
    used, joined, cr_only = set(), [], []
    for cr in crs:
        hit = next((index[k] for k in keys(cr) if k in index and index[k] not in used), None)
        if hit is None:
            cr_only.append(cr)
        else:
            used.add(hit)
            joined.append((cr, kbs[hit]))
    kb_only = [kb for i, kb in enumerate(kbs) if i not in used]

    rows, matrix = [], {}
    for cr, kb in joined:
        cell = f"{cr.get('status')} / {kb_status(kb)}"
        matrix[cell] = matrix.get(cell, 0) + 1
        d = compare(cr, kb, args.min_rel, args.kb_speedup)
        if d:
            rows.append(d)
    rank = {"status": 0, "speedup": 1, "credit": 2}
    rows.sort(key=lambda r: (rank[r["kind"]], r.get("pair") or 0))
    counts = {"joined": len(joined), "crucible_only": len(cr_only), "kernelbench_only": len(kb_only),
              "disagree": len(rows), "agree": len(joined) - len(rows)}
    for r in rows:
        counts[r["kind"]] = counts.get(r["kind"], 0) + 1
        counts["what: " + r["category"]] = counts.get("what: " + r["category"], 0) + 1
    both_ok = [(cr, kb) for cr, kb in joined if cr.get("status") == "ok" and kb.get("correctness")]
    counts["both_pass"] = len(both_ok)
    counts["credited_crucible"] = sum(1 for cr, _ in joined if cr.get("status") == "ok" and credited(cr.get("speedup")))
    key = "speedup" if args.kb_speedup == "run_and_check" else "speedup_eval"
    counts["credited_kernelbench"] = sum(1 for _, kb in joined if kb.get("correctness") and credited(kb.get(key)))

    if args.json:
        print(json.dumps({"kb_speedup": args.kb_speedup, "min_rel": args.min_rel, "counts": counts,
                          "status_matrix": matrix, "disagreements": rows,
                          "crucible_only": [label(r) for r in cr_only],
                          "kernelbench_only": [label(r) for r in kb_only]}, default=str))
        return 0

    print(f"crucible {args.crucible}  vs  KernelBench harness {args.kernelbench} "
          f"(KB speedup: {args.kb_speedup}; speedups listed beyond max(crucible band, {100 * args.min_rel:.0f}%))")
    if rows:
        w = max(len(label(r)) for r in rows)
        print(f"\n{'pair':>5}  {'task: candidate':<{w}}  {'crucible':<22}  {'KernelBench':<22}  disagreement")
        for r in rows:
            crs_txt = f"{r['crucible_status']} {fmt_speedup(r['crucible_speedup'], r['crucible_spread'])}" \
                if r["crucible_status"] == "ok" else r["crucible_status"]
            kbs_txt = f"ok {fmt_speedup(r['kb_speedup'])}" if r["kb_status"] == "correct" else r["kb_status"]
            print(f"{r.get('pair') or '':>5}  {label(r):<{w}}  {crs_txt:<22}  {kbs_txt:<22}  {r['what']}")
            if r.get("kind") == "speedup" and r.get("kb_ref_ms") is not None:
                print(f"{'':>5}  {'':<{w}}  ref {r['crucible_ref_ms']:.4g} ms, cand {r['crucible_cand_ms']:.4g} ms"
                      f"  |  ref {r['kb_ref_ms']:.4g} ms, cand {r['kb_cand_ms']:.4g} ms")
            if r.get("note"):
                print(f"{'':>5}  {'':<{w}}  {r['note']}")
    else:
        print("\nno disagreements")
    print("\ncounts")
    print(f"  joined {counts['joined']}: agree {counts['agree']}, disagree {counts['disagree']} "
          f"(status {counts.get('status', 0)}, speedup {counts.get('speedup', 0)}, credit {counts.get('credit', 0)})")
    print(f"  pass on both sides {counts['both_pass']}; credited (1.01x or more): crucible "
          f"{counts['credited_crucible']}, KernelBench {counts['credited_kernelbench']}")
    for k in sorted(k for k in counts if k.startswith("what: ")):
        print(f"  {k[6:]}: {counts[k]}")
    print("  status matrix (crucible / KernelBench): " + ", ".join(f"{k} {v}" for k, v in sorted(matrix.items())))
    if cr_only or kb_only:
        print(f"  not joined: crucible only {len(cr_only)}, KernelBench only {len(kb_only)}")
        for r in cr_only:
            print(f"    crucible only: {label(r)}")
        for r in kb_only:
            print(f"    KernelBench only: {label(r)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
