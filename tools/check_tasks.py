#!/usr/bin/env python3
"""Development checker for a KernelBench-format task suite (default: env/tasks/cpu).

Tasks are the files NN_name.py under the suite directory, in level folders or not (folders named
variants, hidden folders and __pycache__ are skipped); a task's name is its path relative to the
suite without .py (env/tasks/gpu/level1/01_matmul_fp32.py -> level1/01_matmul_fp32), as the
evaluator's task index names it. For every task it checks, on --device cpu (one thread by
default) or --device cuda:
  load     the file has a docstring and defines Model, get_inputs and get_init_inputs, and the
           reference runs; get_inputs() runs under `with torch.device(DEVICE)`, as the
           evaluator's worker does, and its tensors are then moved to the device;
  time     the reference's median time lies in [--min-ms, --max-ms] (CPU default 1-50 ms: at
           least --min-ms with a warm allocator, at most --max-ms with a cold one, see Allocator;
           CUDA default 1-1000 ms, CUDA events around each call, L2 flushed before it);
  output   every output is a finite floating tensor (float32, float16 or bfloat16) with a
           non-trivial spread (std not ~0);
  signal   outputs depend on the inputs: two independent input draws change the output by a
           large relative amount (--min-change) and change a good share of its elements beyond
           the tolerance (--min-frac); a task that fails here is low-signal (a constant or
           nearly constant output cannot tell a correct kernel from a wrong one);
  stable   the reference agrees with a float64 run of the same reference on input
           distributions 0 and 1 (below: the task's own scale) with a margin (max |a-b| / (atol
           + rtol |b|) <= --max-err-ratio for float32 outputs, --max-err-ratio-lp for
           float16/bfloat16 ones), so a correct reassociated rewrite can pass the evaluator's
           tolerance even without its rounding slack (variants, below).
Tolerances are the evaluator's defaults: --atol/--rtol 1e-4 for float32 and float64 outputs,
--lp-atol/--lp-rtol 1e-2 for float16 and bfloat16 outputs.

With --variants it also checks every file in variants/<task name>/ (variants/<stem>/ for a
suite without levels, variants/level1/<stem>/ for a task in level1/):
  static   the evaluator's static anti-hacking checks (env/eval/harness/static_checks.py) find nothing;
  correct variants (any name not starting with wrong_) must match the reference within the
  tolerance (atol widened, as the evaluator widens it, by 8 times the reference's own rounding
  error on the same inputs: its distance from a float64 copy of itself) on every input
  distribution the evaluator draws, for --seeds seeds each, keep their inputs unchanged, take
  the same constructor and forward parameters as Model, and be faster than the reference by at
  least --min-speedup (median of per-round ratios over --rounds paired, interleaved rounds in
  random order, fresh inputs each round, caches flushed before each timed call);
  wrong_*.py variants must be out of tolerance on at least one distribution and seed.
Every task needs at least 2 correct and 1 wrong variant once it has a variants folder (with
--variants and no --variant filter); tasks without a folder are listed as having none.

On --device cpu, variants that need CUDA (a load_inline with cuda_sources) are not run: with
--build-cuda their module is imported, which builds the extension (a compile and link check;
TORCH_CUDA_ARCH_LIST defaults to 9.0), otherwise they are listed as skipped. Triton variants run
in Triton's interpreter (TRITON_INTERPRET=1; it truncates float32 -> float16/bfloat16
conversions, so low-precision outputs can be off by an ulp there) and are not timed; with --compile-triton every
kernel they launch is also compiled for sm_90 (Triton's own ptxas, no GPU needed). --shrink F divides every
module-level UPPER_CASE integer constant >= 128 of a task by F before get_inputs() and
get_init_inputs() run, to check the GPU suite's tasks and variants on a CPU at smaller shapes;
--no-timing skips the time window and the speedups.

Inputs are the evaluator's: its worker's own make_inputs (env/eval/harness/reference.py; the worker,
env/eval/harness/worker.py, is loaded by path, which loads the harness's modules in its order, as
tests/harness does), and the distributions it draws a task's trials from (docs/evaluator.md,
Correctness): 0 get_inputs() as is, 1 every floating tensor times U(0.5, 2) elementwise, 2 the
same with random signs, 3 as 2 times 32, 4 as 1 with one run of each floating tensor scaled by
16 more; 2 and 3 only for a task whose INPUT_DOMAIN is "any" (the default; "as-given" draws 0,
1 and 4), and each of 2, 3 and 4 left out where the reference's outputs on it are not finite
while they are on 0. The timed rounds draw all of them but 0 in turn, as the evaluator's do.
(On CUDA the worker scales contiguous inputs with its own kernel, harness_kernels.cu, which
this tool does not load: the same distributions, other draws.)

Isolation: by default every task and every variant is checked in a child process of its own
with a time limit (--timeout seconds; its whole process group is killed on expiry), so a crash,
a hang or a CUDA error poisoning its context is reported for that task or variant and the rest
go on. --in-process checks everything in this process instead.

Allocator (CPU): eager PyTorch on CPU allocates its multi-MB outputs with glibc malloc, whose
dynamic mmap/trim thresholds make the same reference take 6 ms or 25 ms (a 4M-element
elementwise chain) depending on what the process allocated before: when large blocks come from
fresh mmaps every output page is faulted in and zeroed. The checker sets the thresholds itself
(mallopt) and measures both regimes: "warm" (thresholds 1 GiB, freed blocks reused, no faults)
and "cold" (thresholds 128 KiB and malloc_trim before each timed call, so every large
allocation faults its pages in afresh). Variants are timed warm by default (the regime where
the reference is fastest, so speedups are conservative for variants that allocate less);
--alloc cold times them in the other regime.

Prints a table, writes a JSON report with --json FILE (each task's reference time and checks,
each variant's correctness and speedup) and exits 1 on any failure. This is a development
tool; the authoritative verdicts come from the evaluator (crucible eval).

Usage:
  .venv/bin/python tools/check_tasks.py [--variants]                      # the CPU suite
  .venv/bin/python tools/check_tasks.py --suite env/tasks/gpu --device cuda --variants --json OUT.json
  .venv/bin/python tools/check_tasks.py --suite env/tasks/gpu --device cpu --shrink 8 --no-timing --variants
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402

# The checks and their helpers are the modules beside this file (check_tasks_*.py); they are found
# there also where this file is loaded by path (tests/harness).
TOOLS = str(Path(__file__).resolve().parent)
if TOOLS not in sys.path:
    sys.path.append(TOOLS)

from check_tasks_checks import check_task, check_variant, compile_triton_sm90, run_child  # noqa: E402
from check_tasks_helpers import (MALLOC, REPO, ROUNDING_FACTOR, build_model, evaluator_worker, fmt,  # noqa: E402
                                 json_safe, load_task, make_inputs, print_table)
# Used by tests/harness/test_check_tasks.py through this module.
from check_tasks_helpers import drop_unfinite, input_dists, timed_dists  # noqa: E402,F401


# ----------------------------------------------------------------------------- isolation

def child_main(args) -> int:
    kind, paths = args.child[0], args.child[1:]
    if args.device == "cuda":
        torch.cuda.init()
    if kind == "task":
        row, _, _ = check_task(Path(paths[0]), paths[1], args)
    elif kind == "compile":
        task = load_task(Path(paths[0]), args)
        found, n = compile_triton_sm90(Path(paths[2]), task, make_inputs(task, args.seed, 0, "cpu"))
        row = {"ok": not found, "problems": found, "kernels": n}
    else:
        task_path, name, vpath = Path(paths[0]), paths[1], Path(paths[2])
        row, task, model = check_task_minimal(task_path, args)
        if row is None:
            row = check_variant(vpath, task_path, task, model, args)
    Path(args.child_out).write_text(json.dumps(json_safe(row)))
    return 0


def check_task_minimal(task_path: Path, args):
    """Loads a task and builds its reference for a variant check; (failure row, None, None) when
    the task itself does not load."""
    try:
        task = load_task(task_path, args)
        model = build_model(task.Model, task, args.device)
        return None, task, model
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "problems": [f"task load: {type(e).__name__}: {e}"]}, None, None


# ----------------------------------------------------------------------------- main

def find_tasks(root: Path) -> list[tuple[Path, str]]:
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if any(part == "variants" or part.startswith(".") or part == "__pycache__" for part in rel.parts[:-1]):
            continue
        if not p.stem[:1].isdigit():
            continue
        out.append((p, rel.with_suffix("").as_posix()))
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", default=None, help="task directory (default: env/tasks/cpu)")
    p.add_argument("--suite", default=None, help="task directory, as the positional argument")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--variants", action="store_true", help="also check variants/<task>/*.py")
    p.add_argument("--only", action="append", default=[],
                   help="check only tasks whose name contains this (repeatable)")
    p.add_argument("--variant", action="append", default=[],
                   help="check only variants whose stem contains this (repeatable)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the report as JSON to FILE")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--atol", type=float, default=1e-4, help="float32 absolute tolerance")
    p.add_argument("--rtol", type=float, default=1e-4, help="float32 relative tolerance")
    p.add_argument("--lp-atol", type=float, default=1e-2, help="float16/bfloat16 absolute tolerance")
    p.add_argument("--lp-rtol", type=float, default=1e-2, help="float16/bfloat16 relative tolerance")
    p.add_argument("--min-ms", type=float, default=1.0)
    p.add_argument("--max-ms", type=float, default=None, help="default 50 on cpu, 1000 on cuda")
    p.add_argument("--min-change", type=float, default=0.1,
                   help="minimum relative L2 change of the output between two input draws")
    p.add_argument("--min-frac", type=float, default=0.25,
                   help="minimum fraction of output elements that change between two input draws")
    p.add_argument("--max-err-ratio", type=float, default=0.25,
                   help="max float32-vs-float64 error of the reference, as a fraction of the tolerance")
    p.add_argument("--max-err-ratio-lp", type=float, default=0.75,
                   help="the same for float16/bfloat16 outputs (rounding the float64 result costs up to half an ulp)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--seeds", type=int, default=3, help="seeds per distribution for variant correctness")
    p.add_argument("--rounds", type=int, default=31, help="paired timing rounds per variant")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--ref-reps", type=int, default=11, help="timed reference calls for the time window")
    p.add_argument("--min-speedup", type=float, default=1.1)
    p.add_argument("--no-flush", action="store_true", help="do not flush caches between timed calls")
    p.add_argument("--no-timing", action="store_true", help="skip the time window and the variant speedups")
    p.add_argument("--alloc", choices=("warm", "cold"), default="warm",
                   help="CPU allocator regime for variant timing (default warm: no page faults on reuse)")
    p.add_argument("--shrink", type=int, default=1,
                   help="divide every module-level UPPER_CASE int constant >= 128 of a task by this")
    p.add_argument("--build-cuda", action="store_true",
                   help="on --device cpu, import (build) variants that need CUDA instead of skipping them")
    p.add_argument("--compile-triton", action="store_true",
                   help="on --device cpu, also compile every Triton kernel a variant launches for sm_90 "
                        "(Triton's own ptxas; no GPU needed)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per task and per variant (child process)")
    p.add_argument("--in-process", action="store_true", help="no child processes (no timeouts, no crash isolation)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    p.add_argument("--child-args", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_args:
        child, child_out = args.child, args.child_out
        args = argparse.Namespace(**json.loads(args.child_args))
        args.child, args.child_out = child, child_out
    if args.max_ms is None:
        args.max_ms = 1000.0 if args.device == "cuda" else 50.0
    return args


def setup(args):
    torch.set_num_threads(args.threads)
    # the evaluator's worker's fixed backend settings (env/eval/harness/worker.py): no TF32 anywhere
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.benchmark = False
    if args.device == "cpu":
        if not (args.child and args.child[0] == "compile"):
            os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton variants run in the interpreter
        if args.build_cuda:
            os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
        MALLOC.set(args.alloc)
    elif not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device available")
    if args.child or args.in_process:
        # Where tasks run: the worker's settings (TRITON_F32_DEFAULT, torch.compile's first-use
        # patches) in place before a variant imports triton or compiles, as in the evaluator.
        evaluator_worker()


def main(argv=None) -> int:
    args = parse_args(argv)
    setup(args)
    if args.child:
        return child_main(args)

    if args.device == "cpu" and not MALLOC.available:
        print("warning: glibc mallopt not available; warm and cold timings use the default allocator")
    root = Path(args.suite or args.dir or (REPO / "env" / "tasks" / "cpu"))
    if not root.is_absolute() and not root.exists():
        root = REPO / root
    root = root.resolve()
    tasks = find_tasks(root)
    if args.only:
        tasks = [t for t in tasks if any(s in t[1] for s in args.only)]
    if not tasks:
        print(f"no tasks found in {root}")
        return 1

    report = {"suite": str(root), "device": args.device,
              "hardware": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "options": {k: v for k, v in vars(args).items()
                                                      if k not in ("child", "child_out", "child_args")},
              "tasks": []}
    failures = 0
    task_rows, variant_rows = [], []
    for tp, name in tasks:
        if args.in_process:
            row, task, model = check_task(tp, name, args)
        else:
            row = run_child("task", [str(tp), name], args, args.timeout)
            row.setdefault("task", name)
        row["task"] = name
        row["variants"] = []
        failures += not row["ok"]
        report["tasks"].append(row)
        probs = row.get("problems", [])
        task_rows.append([name, fmt(row.get("ref_ms"), ".3f"), fmt(row.get("ref_cold_ms")),
                          ",".join(row.get("dtypes") or []), fmt(row.get("change")), fmt(row.get("frac")),
                          fmt(row.get("err64"), ".3f"), "ok" if row["ok"] else "FAIL: " + "; ".join(probs)])
        print(f"[task] {name}: ref {fmt(row.get('ref_ms'), '.3f')} ms, "
              f"{'ok' if row['ok'] else '; '.join(probs)}", flush=True)
        if not args.variants:
            continue
        vdir = root / "variants" / name
        vfiles = sorted(vdir.glob("*.py")) if vdir.is_dir() else []
        if args.variant:
            vfiles = [v for v in vfiles if any(s in v.stem for s in args.variant)]
        if not vdir.is_dir():
            variant_rows.append([name, "-", "-", "-", "-", "-", "-", "-", "no variants"])
            continue
        n_correct = sum(not v.stem.startswith("wrong_") for v in vfiles)
        n_wrong = len(vfiles) - n_correct
        if not args.variant and (n_correct < 2 or n_wrong < 1):
            failures += 1
            msg = f"needs >= 2 correct and >= 1 wrong variant (has {n_correct}, {n_wrong})"
            row["variant_problems"] = [msg]
            variant_rows.append([name, "-", "-", "-", "-", "-", "-", "-", "FAIL: " + msg])
        for vp in vfiles:
            if args.in_process:
                if model is None:
                    vrow = {"ok": False, "problems": ["the task failed to load or run"]}
                else:
                    vrow = check_variant(vp, tp, task, model, args)
            else:
                vrow = run_child("variant", [str(tp), name, str(vp)], args, args.timeout)
            vrow["variant"] = vp.stem
            vrow.setdefault("kind", "wrong" if vp.stem.startswith("wrong_") else "correct")
            failures += not vrow["ok"]
            row["variants"].append(vrow)
            vprob = vrow.get("problems", [])
            status = ("ok" if vrow["ok"] else "FAIL: " + "; ".join(vprob))
            if vrow.get("status"):
                status += f" ({vrow['status']})"
            variant_rows.append([name, vp.stem, vrow["kind"], fmt(vrow.get("err"), ".3g"),
                                 fmt(vrow.get("speedup")), fmt(vrow.get("ref_ms"), ".3f"),
                                 fmt(vrow.get("cand_ms"), ".3f"), fmt(vrow.get("load_s"), ".1f"), status])
            print(f"[variant] {name}/{vp.stem}: speedup {fmt(vrow.get('speedup'))} "
                  f"err/tol {fmt(vrow.get('err'), '.3g')} {status}", flush=True)

    print()
    print(f"tasks in {root} on {report['hardware']} (atol/rtol {args.atol}/{args.rtol} float32, "
          f"{args.lp_atol}/{args.lp_rtol} float16/bfloat16{', shrink ' + str(args.shrink) if args.shrink > 1 else ''}; "
          f"ref_ms = median reference ms ({'CUDA events' if args.device == 'cuda' else 'warm allocator'}), "
          f"cold_ms = CPU cold allocator, change = relative L2 change between two input draws, "
          f"frac = share of elements that change, err64 = reference-vs-float64 error / tolerance)")
    print_table(["task", "ref_ms", "cold_ms", "dtypes", "change", "frac", "err64", "status"], task_rows)
    if args.variants:
        print(f"variants (err = worst |cand - ref| / (atol + slack + rtol |ref|), slack = {ROUNDING_FACTOR:g} x the "
              f"reference's own rounding error, over {args.seeds} seeds x the evaluator's input distributions; "
              f"speedup = median of {args.rounds} paired ref/cand ratios)")
        print_table(["task", "variant", "kind", "err", "speedup", "ref_ms", "cand_ms", "load_s", "status"],
                    variant_rows)
    report["failures"] = failures
    if args.json:
        Path(args.json).write_text(json.dumps(json_safe(report), indent=1) + "\n")
        print(f"report written to {args.json}")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
