#!/usr/bin/env python3
"""How the evaluator's static screen judges a corpus of published kernels.

Runs env/eval/harness/static_checks.py's check_source(custom_code, ref_code) on every kernel of one or
more JSONL releases (one JSON object a line with `level_id`, `task_id`, `ref_code`, `custom_code`,
as CUDA-L1 publishes them in optimized_cuda_code/*.json; data/cuda-l1/SOURCE.txt) and prints,
per release and in total: kernels, kernels with no code, passed, refused, sources that do not
parse (the screen passes those; the worker calls them compile_error); refusals by class (a
kernel counted once in every class it hits, once under its FIRST class, the class of its
first finding by line, and apart where it is its only class); and for each class a few examples (release, level, task, line, message).

  python3 tools/bench/static_screen_survey.py data/cuda-l1/{a100,3090,l40,h20}.json
  python3 tools/bench/static_screen_survey.py data/cuda-l1/ --exclude h100 --json
  python3 tools/bench/static_screen_survey.py data/cuda-l1/h100.json --examples 0   # counts only

The screen is imported by path, as the worker imports it (env/eval/harness/worker.py); --static-checks
names another copy (an older or newer version of the screen) to compare. The hyperparameter check
(`static:hyperparameters`) runs in the worker after the candidate module executes, so it is not
part of this survey.
"""
import argparse
import ast
import collections
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
_DEFAULT_CHECKS = os.path.join(_REPO, "env", "eval", "harness", "static_checks.py")


def load_static_checks(path):
    """Imports static_checks.py from a file on its own (it imports nothing of the harness; the
    worker loads it as a module of its package, env/eval/harness/__init__.py)."""
    spec = importlib.util.spec_from_file_location("crucible_static_checks_survey", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def checks_at_revision(rev):
    """static_checks.py as it is at git revision `rev` of this checkout, in a temporary file."""
    try:
        src = subprocess.run(["git", "-C", _REPO, "show", f"{rev}:env/eval/harness/static_checks.py"],
                             check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", "") or str(e)
        sys.exit(f"static_screen_survey: cannot read env/eval/harness/static_checks.py at {rev}: {err.strip()}")
    fd, path = tempfile.mkstemp(prefix=f"static_checks_{rev.replace('/', '_')}_", suffix=".py")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(src)
    return path


def release_files(paths, exclude):
    """(release name, path) for each file named, and each *.json / *.jsonl in a folder named."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            names = sorted(n for n in os.listdir(p) if n.endswith((".json", ".jsonl")))
            files = [os.path.join(p, n) for n in names]
        elif os.path.isfile(p):
            files = [p]
        else:
            sys.exit(f"static_screen_survey: no such file or folder: {p}")
        for f in files:
            rel = os.path.basename(f).rsplit(".", 1)[0]
            if rel in exclude:
                continue
            out.append((rel, f))
    seen = collections.Counter(r for r, _ in out)
    dup = [r for r, n in seen.items() if n > 1]
    if dup:
        sys.exit(f"static_screen_survey: two files give the release name(s) {', '.join(dup)}")
    return out


def read_release(path):
    """The kernels of one JSONL file: dicts with level, task, ref, custom (and score if given)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"static_screen_survey: {path}:{n}: not a JSON object a line ({e}); "
                         "CUDA-L1's optimized_cuda_code/codes/*.json are not this format, use "
                         "optimized_cuda_code/*.json")
            rows.append({
                "level": d.get("level_id"),
                "task": d.get("task_id"),
                "ref": d.get("ref_code") or "",
                "custom": d.get("custom_code") or "",
                "score": d.get("score_default"),
            })
    return rows


def survey(releases, checks, n_examples, per_kernel):
    """Screens every kernel; returns the result as a JSON-ready dict."""
    classes = set()
    per_release = {}
    examples = collections.defaultdict(list)
    kernels_out = []
    t0 = time.perf_counter()
    for rel, path in releases:
        rows = read_release(path)
        st = {"file": path, "lines": len(rows), "no_code": 0, "screened": 0, "passed": 0,
              "refused": 0, "unparsable": 0, "screen_errors": 0,
              "by_class": collections.Counter(), "by_first_class": collections.Counter(),
              "by_sole_class": collections.Counter()}
        for r in rows:
            if not r["custom"].strip():
                st["no_code"] += 1
                continue
            st["screened"] += 1
            try:
                ast.parse(r["custom"])
            except (SyntaxError, ValueError):
                # check_source passes a source that does not parse (the worker reports it as
                # compile_error when it runs it): count it apart, not as passed.
                st["unparsable"] += 1
                if per_kernel:
                    kernels_out.append({"release": rel, "level": r["level"], "task": r["task"],
                                        "score_default": r["score"], "unparsable": True,
                                        "findings": []})
                continue
            try:
                found = checks.check_source(r["custom"], r["ref"])
            except Exception as e:  # a crash of the screen itself is worth knowing about
                found = [("static:screen_error", 0, f"{type(e).__name__}: {e}")]
                st["screen_errors"] += 1
            found = [(c.split(":", 1)[1] if c.startswith("static:") else c, line, msg)
                     for c, line, msg in found]
            if not found:
                st["passed"] += 1
            else:
                st["refused"] += 1
                # check_source returns its findings sorted by (line, class): the first is the
                # first the screen meets reading the file top-down.
                st["by_first_class"][found[0][0]] += 1
                hit = []
                for c, line, msg in found:
                    if c not in hit:
                        hit.append(c)
                        st["by_class"][c] += 1
                        classes.add(c)
                        # Examples from distinct tasks: the releases share most tasks, and
                        # often the same kernel for them.
                        if len(examples[c]) < n_examples and not any(
                                (e["level"], e["task"]) == (r["level"], r["task"])
                                for e in examples[c]):
                            examples[c].append({"release": rel, "level": r["level"],
                                                "task": r["task"], "line": line,
                                                "message": msg})
                if len(hit) == 1:
                    st["by_sole_class"][hit[0]] += 1
            if per_kernel:
                kernels_out.append({"release": rel, "level": r["level"], "task": r["task"],
                                    "score_default": r["score"],
                                    "findings": [list(f) for f in found]})
        per_release[rel] = st
    total = {"lines": 0, "no_code": 0, "screened": 0, "passed": 0, "refused": 0,
             "unparsable": 0, "screen_errors": 0, "by_class": collections.Counter(),
             "by_first_class": collections.Counter(), "by_sole_class": collections.Counter()}
    for st in per_release.values():
        for k in ("lines", "no_code", "screened", "passed", "refused", "unparsable",
                  "screen_errors"):
            total[k] += st[k]
        total["by_class"].update(st["by_class"])
        total["by_first_class"].update(st["by_first_class"])
        total["by_sole_class"].update(st["by_sole_class"])
    order = sorted(classes, key=lambda c: (-total["by_class"][c], c))
    for st in list(per_release.values()) + [total]:
        st["by_class"] = {c: st["by_class"].get(c, 0) for c in order}
        st["by_first_class"] = {c: st["by_first_class"].get(c, 0) for c in order}
        st["by_sole_class"] = {c: st["by_sole_class"].get(c, 0) for c in order}
    out = {
        "static_checks": checks.survey_label,
        "static_checks_sha256": checks.survey_sha256,
        "seconds": round(time.perf_counter() - t0, 3),
        "classes": order,
        "releases": per_release,
        "total": total,
        "examples": {c: examples[c] for c in order} if n_examples else {},
    }
    if per_kernel:
        out["kernels"] = kernels_out
    return out


def print_table(res):
    rels = list(res["releases"])
    cols = rels + (["total"] if len(rels) > 1 else [])
    stats = [res["releases"][r] for r in rels] + ([res["total"]] if len(rels) > 1 else [])
    w0 = max([22] + [len(c) + 2 for c in res["classes"]])
    w = max([12] + [len(c) + 2 for c in cols])

    def row(label, vals):
        print(f"{label:<{w0}}" + "".join(f"{v:>{w}}" for v in vals))

    def pct(n, d):
        return f"{n} ({100.0 * n / d:.0f}%)" if d else str(n)

    print(f"static screen: {res['static_checks']} (sha256 {res['static_checks_sha256'][:12]}, "
          f"{res['seconds']} s)")
    print()
    row("", cols)
    row("lines", [s["lines"] for s in stats])
    row("no code (skipped)", [s["no_code"] for s in stats])
    row("kernels screened", [s["screened"] for s in stats])
    row("passed", [pct(s["passed"], s["screened"]) for s in stats])
    row("refused", [pct(s["refused"], s["screened"]) for s in stats])
    row("does not parse", [s["unparsable"] for s in stats])
    if any(s["screen_errors"] for s in stats):
        row("screen errors", [s["screen_errors"] for s in stats])
    if not res["classes"]:
        return
    print()
    print("refusals by class (a kernel counted once in each class it hits):")
    for c in res["classes"]:
        row("  " + c, [s["by_class"][c] for s in stats])
    print()
    print("refusals by first class (each refused kernel counted once):")
    for c in res["classes"]:
        if res["total"]["by_first_class"][c]:
            row("  " + c, [s["by_first_class"][c] for s in stats])
    print()
    print("refused by one class alone (would pass without that class):")
    for c in res["classes"]:
        if res["total"]["by_sole_class"][c]:
            row("  " + c, [s["by_sole_class"][c] for s in stats])
    if res["examples"]:
        print()
        print("examples (release, level, task, line: message):")
        for c in res["classes"]:
            print(f"  {c}:")
            for e in res["examples"][c]:
                msg = e["message"] if len(e["message"]) <= 110 else e["message"][:107] + "..."
                print(f"    {e['release']} L{e['level']} T{e['task']} line {e['line']}: {msg}")


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Run the evaluator's static screen (env/eval/harness/static_checks.py) over "
                    "published kernels (JSONL: level_id, task_id, ref_code, custom_code; "
                    "CUDA-L1's optimized_cuda_code/*.json, copied to data/cuda-l1/) and count "
                    "what it refuses, by class.",
        epilog="The release name is the file's name without its extension. data/cuda-l1/: "
               "a100, 3090, l40, h20 are the development set; h100 is held out for acceptance "
               "(run it with --examples 0 to see counts only). Reproduces (docs/PERFORMANCE.md, goals "
               "table): legitimate released kernels credited, the static screen's part. No environment "
               "variables.")
    ap.add_argument("paths", nargs="+", metavar="PATH",
                    help="JSONL files, or folders whose *.json / *.jsonl files are read")
    ap.add_argument("--exclude", action="append", default=[], metavar="RELEASE",
                    help="leave out this release (file name without extension); repeatable")
    ap.add_argument("--static-checks", default=_DEFAULT_CHECKS, metavar="FILE",
                    help="the static_checks.py to import (default: %(default)s)")
    ap.add_argument("--rev", metavar="REV",
                    help="use env/eval/harness/static_checks.py as committed at this git revision "
                         "(e.g. HEAD, a commit id) instead of the working tree's; overrides "
                         "--static-checks")
    ap.add_argument("--examples", type=int, default=3, metavar="N",
                    help="examples to show per class (default 3; 0: none)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    ap.add_argument("--per-kernel", action="store_true",
                    help="with --json, also list every kernel's findings (for diffing two "
                         "versions of the screen)")
    args = ap.parse_args(argv)
    releases = release_files(args.paths, set(args.exclude))
    if not releases:
        sys.exit("static_screen_survey: no release files")
    path = args.static_checks
    if args.rev:
        path = checks_at_revision(args.rev)
    try:
        checks = load_static_checks(path)
        with open(path, "rb") as f:
            checks.survey_sha256 = hashlib.sha256(f.read()).hexdigest()
        checks.survey_label = (f"env/eval/harness/static_checks.py at {args.rev}" if args.rev
                               else os.path.abspath(path))
    finally:
        if args.rev:
            os.unlink(path)
    res = survey(releases, checks, max(0, args.examples), args.per_kernel and args.json)
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
    else:
        print_table(res)


if __name__ == "__main__":
    main()
