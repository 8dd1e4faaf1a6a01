#!/usr/bin/env python3
"""Development checker for a KernelBench-format task directory (default: env/tasks/cpu).

For every task NN_name.py it checks, on one CPU thread:
  load     the file defines Model, get_inputs and get_init_inputs, and the reference runs;
  time     the reference's median time is at least --min-ms with a warm allocator and at most
           --max-ms with a cold one (default 1-50 ms; see Allocator below);
  output   every output is a finite float32 tensor with a non-trivial spread (std not ~0);
  signal   outputs depend on the inputs: two independent input draws change the output by a
           large relative amount (--min-change) and change a good share of its elements (--min-frac);
  stable   the float32 reference agrees with a float64 run of the same reference on both input
           distributions with a margin (max |a-b| / (atol + rtol |b|) <= --max-err-ratio), so a
           correct reassociated float32 rewrite can pass the evaluator's tolerance.

With --variants it also checks every file in variants/<task stem>/:
  correct variants (any name not starting with wrong_) must match the reference within
  atol/rtol on both input distributions for --seeds seeds, keep their inputs unchanged, take
  the same constructor and forward parameters as Model, and be faster than the reference by at
  least --min-speedup (median of per-round ratios over --rounds paired, interleaved rounds in
  random order, fresh inputs each round, cache flushed before each timed call);
  wrong_*.py variants must be out of tolerance on at least one distribution and seed.

The two input distributions are the evaluator's: get_inputs() as is, and the same inputs with
every floating tensor multiplied elementwise by U(0.5, 2).

Allocator: eager PyTorch on CPU allocates its multi-MB outputs with glibc malloc, whose dynamic
mmap/trim thresholds make the same reference take 6 ms or 25 ms (a 4M-element elementwise
chain) depending on what the process allocated before: when large blocks come from fresh mmaps
every output page is faulted in and zeroed. The checker sets the thresholds itself (mallopt)
and measures both regimes: "warm" (thresholds 1 GiB, freed blocks reused, no faults) and
"cold" (thresholds 128 KiB and malloc_trim before each timed call, so every large allocation
faults its pages in afresh). The reference must take at
least --min-ms warm and at most --max-ms cold. Variants are timed warm by default (the regime
where the reference is fastest, so speedups are conservative for variants that allocate
less); --alloc cold times them in the other regime.

Prints a table and exits 1 on any failure. This is a development tool; the authoritative
verdicts come from the evaluator (crucible eval).

Usage: .venv/bin/python tools/check_tasks.py [DIR] [--variants] [--only SUBSTR] ...
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import importlib.util
import inspect
import math
import os
import random
import statistics
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- helpers

def load_module(path: Path, tag: str):
    name = f"_check_{tag}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def make_inputs(task, seed: int, dist: int):
    torch.manual_seed(seed)
    inputs = list(task.get_inputs())
    if dist == 1:
        g = torch.Generator().manual_seed(seed * 7919 + 17)
        out = []
        for x in inputs:
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                f = torch.empty(x.shape, dtype=x.dtype).uniform_(0.5, 2.0, generator=g)
                x = x * f
            out.append(x)
        inputs = out
    return inputs


def as_list(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return list(out)
    raise TypeError(f"forward returned {type(out).__name__}, not a tensor or a tuple of tensors")


def err_ratio(cand, ref, atol, rtol) -> float:
    """max |c - r| / (atol + rtol |r|) over all outputs; inf on shape/dtype/finiteness mismatch."""
    worst = 0.0
    if len(cand) != len(ref):
        return math.inf
    for c, r in zip(cand, ref):
        if type(c) is not torch.Tensor or c.shape != r.shape or c.dtype != r.dtype:
            return math.inf
        if c.numel() == 0:
            continue
        c64, r64 = c.double(), r.double()
        if not torch.isfinite(c64).all():
            return math.inf
        ratio = ((c64 - r64).abs() / (atol + rtol * r64.abs())).max().item()
        worst = max(worst, ratio)
    return worst


class Malloc:
    """Switches glibc malloc between the warm and cold regimes (see the module docstring)."""

    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3

    def __init__(self):
        self.mallopt = self.malloc_trim = None
        self.regime = "default"
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            self.mallopt = libc.mallopt
            self.malloc_trim = libc.malloc_trim
        except (OSError, AttributeError):
            pass

    @property
    def available(self) -> bool:
        return self.mallopt is not None

    def set(self, regime: str):
        if self.mallopt is None:
            return
        self.regime = regime
        value = (1 << 30) if regime == "warm" else 128 * 1024
        self.mallopt(self.M_MMAP_THRESHOLD, value)
        self.mallopt(self.M_TRIM_THRESHOLD, value)

    def before_timed_call(self):
        """Cold: hand every free page back to the OS, so the next allocations fault them in again."""
        if self.regime == "cold" and self.malloc_trim is not None:
            self.malloc_trim(0)


MALLOC = Malloc()


class Flusher:
    """Evicts the caches by writing a buffer larger than the last-level cache."""

    def __init__(self, enabled: bool, mib: int = 64):
        self.buf = torch.empty(mib * 1024 * 1024 // 4, dtype=torch.float32) if enabled else None

    def __call__(self):
        if self.buf is not None:
            self.buf.fill_(1.0)


def time_once(fn, inputs, flush) -> float:
    flush()
    MALLOC.before_timed_call()
    t0 = time.perf_counter_ns()
    fn(*inputs)
    return (time.perf_counter_ns() - t0) / 1e6


def signature_problem(model_cls, cand_cls) -> str | None:
    for meth in ("__init__", "forward"):
        a = inspect.signature(getattr(model_cls, meth))
        b = inspect.signature(getattr(cand_cls, meth))
        pa = [(p.name, p.kind, p.default) for p in a.parameters.values()]
        pb = [(p.name, p.kind, p.default) for p in b.parameters.values()]
        if pa != pb:
            return f"{meth} signature {b} differs from Model's {a}"
    return None


def fmt(x, spec=".2f"):
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, spec)


def print_table(headers, rows):
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(str(c)))
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    print()


# ----------------------------------------------------------------------------- task checks

def check_task(path: Path, args, flush):
    """Returns (row, problems, task_module or None, ref_model or None)."""
    problems = []
    row = {"task": path.stem, "ref_warm": None, "ref_cold": None, "change": None, "frac": None, "err64": None}
    try:
        task = load_module(path, "task")
        for name in ("Model", "get_inputs", "get_init_inputs"):
            if not hasattr(task, name):
                raise RuntimeError(f"missing {name}")
        doc = (task.__doc__ or "").strip()
        if not doc:
            problems.append("no docstring")
        torch.manual_seed(0)
        model = task.Model(*task.get_init_inputs()).eval()
    except Exception as e:  # noqa: BLE001
        problems.append(f"load: {type(e).__name__}: {e}")
        return row, problems, None, None

    with torch.no_grad():
        try:
            outs = {}
            for seed in (args.seed, args.seed + 1):
                for dist in (0, 1):
                    outs[seed, dist] = as_list(model(*make_inputs(task, seed, dist)))
        except Exception as e:  # noqa: BLE001
            problems.append(f"run: {type(e).__name__}: {e}")
            return row, problems, task, None

        # output type and spread
        for i, y in enumerate(outs[args.seed, 0]):
            if type(y) is not torch.Tensor or y.dtype != torch.float32:
                problems.append(f"output {i} is not a float32 tensor")
                continue
            if not torch.isfinite(y).all():
                problems.append(f"output {i} has non-finite values")
            if y.numel() > 1:
                std = y.double().std().item()
                scale = y.double().abs().mean().item()
                if not std > 1e-6 or std < 1e-3 * scale:
                    problems.append(f"output {i} is nearly constant (std {std:.3g}, mean |y| {scale:.3g})")

        # dependence on the inputs: two independent draws
        a, b = outs[args.seed, 0], outs[args.seed + 1, 0]
        change, frac = math.inf, 1.0
        for ya, yb in zip(a, b):
            ya, yb = ya.double(), yb.double()
            denom = max(ya.norm().item(), yb.norm().item(), 1e-30)
            change = min(change, (ya - yb).norm().item() / denom)
            differs = (ya - yb).abs() > (args.atol + args.rtol * yb.abs())
            frac = min(frac, differs.double().mean().item())
        row["change"], row["frac"] = change, frac
        if change < args.min_change:
            problems.append(f"output barely depends on inputs (relative change {change:.3g})")
        if frac < args.min_frac:
            problems.append(f"only {frac:.0%} of output elements change between input draws")

        # determinism
        again = as_list(model(*make_inputs(task, args.seed, 0)))
        if err_ratio(again, outs[args.seed, 0], 0.0, 0.0) > 0:
            if err_ratio(again, outs[args.seed, 0], args.atol, args.rtol) > 1:
                problems.append("reference is not deterministic")

        # numerical stability against float64
        worst = 0.0
        try:
            model64 = task.Model(*task.get_init_inputs()).double().eval()
            for seed in (args.seed, args.seed + 1):
                for dist in (0, 1):
                    inp = make_inputs(task, seed, dist)
                    inp64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                             for x in inp]
                    y64 = [y.to(torch.float32) for y in as_list(model64(*inp64))]
                    # compare fp32 against fp64 rounded to fp32, in the evaluator's metric
                    worst = max(worst, err_ratio(outs[seed, dist], y64, args.atol, args.rtol))
        except Exception as e:  # noqa: BLE001
            problems.append(f"float64 run failed: {type(e).__name__}: {e}")
        row["err64"] = worst
        if worst > args.max_err_ratio:
            problems.append(f"float32 vs float64 error is {worst:.2f} of the tolerance (max {args.max_err_ratio})")

        # reference time on one thread, with a warm and with a cold allocator
        inp = make_inputs(task, args.seed, 0)
        for regime in ("warm", "cold"):
            MALLOC.set(regime)
            for _ in range(2):
                model(*inp)
            row["ref_" + regime] = statistics.median(time_once(model, inp, flush) for _ in range(args.ref_reps))
        MALLOC.set(args.alloc)
        if row["ref_warm"] < args.min_ms:
            problems.append(f"reference takes {row['ref_warm']:.2f} ms (warm allocator), below {args.min_ms} ms")
        if row["ref_cold"] > args.max_ms:
            problems.append(f"reference takes {row['ref_cold']:.2f} ms (cold allocator), above {args.max_ms} ms")

    return row, problems, task, model


# ----------------------------------------------------------------------------- variant checks

def check_variant(vpath: Path, task, model, args, flush):
    wrong = vpath.stem.startswith("wrong_")
    row = {"variant": vpath.stem, "kind": "wrong" if wrong else "correct", "err": None,
           "speedup": None, "ref_ms": None, "cand_ms": None, "load_s": None}
    problems = []
    try:
        doc_ok = True
        t0 = time.perf_counter()
        mod = load_module(vpath, "variant")
        row["load_s"] = time.perf_counter() - t0
        if not (mod.__doc__ or "").strip():
            doc_ok = False
        if not hasattr(mod, "ModelNew"):
            raise RuntimeError("no ModelNew")
        sig = signature_problem(task.Model, mod.ModelNew)
        if sig:
            problems.append(sig)
        torch.manual_seed(0)
        cand = mod.ModelNew(*task.get_init_inputs()).eval()
        if not doc_ok:
            problems.append("no docstring")
    except Exception as e:  # noqa: BLE001
        problems.append(f"load: {type(e).__name__}: {e}")
        if args.verbose:
            traceback.print_exc()
        return row, problems

    with torch.no_grad():
        worst = 0.0
        failed_on = []
        try:
            for s in range(args.seeds):
                seed = args.seed + 100 + s
                for dist in (0, 1):
                    inp = make_inputs(task, seed, dist)
                    ref = as_list(model(*inp))
                    kept = [x.clone() if isinstance(x, torch.Tensor) else x for x in inp]
                    out = as_list(cand(*inp))
                    r = err_ratio(out, ref, args.atol, args.rtol)
                    worst = max(worst, r)
                    if r > 1.0:
                        failed_on.append((seed, dist))
                    for x, k in zip(inp, kept):
                        if isinstance(x, torch.Tensor) and not torch.equal(x, k):
                            problems.append("changes its inputs")
                            break
        except Exception as e:  # noqa: BLE001
            if wrong:
                worst = math.inf
                failed_on.append(("exception", str(e)[:60]))
            else:
                problems.append(f"run: {type(e).__name__}: {e}")
                return row, problems
        row["err"] = worst
        if wrong:
            if not failed_on:
                problems.append(f"wrong variant passes the tolerance (worst {worst:.2f} of tol)")
            return row, sorted(set(problems))
        if failed_on:
            problems.append(f"out of tolerance ({worst:.3g} x tol) on (seed, dist) {failed_on[:3]}")

        # paired, interleaved timing; fresh inputs each round, random order
        inp = make_inputs(task, args.seed, 0)
        for _ in range(args.warmup):
            model(*inp)
            cand(*inp)
        rng = random.Random(args.seed)
        ratios, tr, tc = [], [], []
        for i in range(args.rounds):
            inp = make_inputs(task, args.seed + 1000 + i, i % 2)
            if rng.random() < 0.5:
                a = time_once(model, inp, flush)
                b = time_once(cand, inp, flush)
            else:
                b = time_once(cand, inp, flush)
                a = time_once(model, inp, flush)
            tr.append(a)
            tc.append(b)
            ratios.append(a / b)
        row["speedup"] = statistics.median(ratios)
        row["ref_ms"] = statistics.median(tr)
        row["cand_ms"] = statistics.median(tc)
        if row["speedup"] < args.min_speedup:
            problems.append(f"speedup {row['speedup']:.2f}x below {args.min_speedup}x")
    return row, sorted(set(problems))


# ----------------------------------------------------------------------------- main

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", default=str(REPO / "env" / "tasks" / "cpu"),
                   help="task directory (default: env/tasks/cpu)")
    p.add_argument("--variants", action="store_true", help="also check variants/<task>/*.py")
    p.add_argument("--only", action="append", default=[],
                   help="check only tasks whose stem contains this (repeatable)")
    p.add_argument("--variant", action="append", default=[],
                   help="check only variants whose stem contains this (repeatable)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--atol", type=float, default=1e-4)
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--min-ms", type=float, default=1.0)
    p.add_argument("--max-ms", type=float, default=50.0)
    p.add_argument("--min-change", type=float, default=0.1,
                   help="minimum relative L2 change of the output between two input draws")
    p.add_argument("--min-frac", type=float, default=0.25,
                   help="minimum fraction of output elements that change between two input draws")
    p.add_argument("--max-err-ratio", type=float, default=0.25,
                   help="max float32-vs-float64 error of the reference, as a fraction of the tolerance")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--seeds", type=int, default=3, help="seeds per distribution for variant correctness")
    p.add_argument("--rounds", type=int, default=31, help="paired timing rounds per variant")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--ref-reps", type=int, default=11, help="timed reference calls for the 1-50 ms check")
    p.add_argument("--min-speedup", type=float, default=1.1)
    p.add_argument("--no-flush", action="store_true", help="do not flush caches between timed calls")
    p.add_argument("--alloc", choices=("warm", "cold"), default="warm",
                   help="allocator regime for variant timing (default warm: no page faults on reuse)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    if not MALLOC.available:
        print("warning: glibc mallopt not available; warm and cold timings use the default allocator")
    MALLOC.set(args.alloc)
    flush = Flusher(not args.no_flush)
    root = Path(args.dir)
    if not root.is_absolute() and not root.exists():
        root = REPO / root
    tasks = sorted(q for q in root.glob("*.py") if q.stem[:1].isdigit())
    if args.only:
        tasks = [t for t in tasks if any(s in t.stem for s in args.only)]
    if not tasks:
        print(f"no tasks found in {root}")
        return 1

    failures = 0
    task_rows, variant_rows = [], []
    for tp in tasks:
        row, problems, task, model = check_task(tp, args, flush)
        failures += bool(problems)
        task_rows.append([row["task"], fmt(row["ref_warm"]), fmt(row["ref_cold"]), fmt(row["change"]), fmt(row["frac"]),
                          fmt(row["err64"], ".3f"), "ok" if not problems else "FAIL: " + "; ".join(problems)])
        print(f"[task] {tp.stem}: {'ok' if not problems else '; '.join(problems)}", flush=True)
        if not args.variants or task is None or model is None:
            continue
        vdir = root / "variants" / tp.stem
        vfiles = sorted(vdir.glob("*.py")) if vdir.is_dir() else []
        if args.variant:
            vfiles = [v for v in vfiles if any(s in v.stem for s in args.variant)]
        n_correct = sum(not v.stem.startswith("wrong_") for v in vfiles)
        n_wrong = len(vfiles) - n_correct
        if not args.variant and (n_correct < 2 or n_wrong < 1):
            failures += 1
            variant_rows.append([tp.stem, "-", "-", "-", "-", "-", "-", "-",
                                 f"FAIL: needs >= 2 correct and >= 1 wrong variant (has {n_correct}, {n_wrong})"])
        for vp in vfiles:
            vrow, vprob = check_variant(vp, task, model, args, flush)
            failures += bool(vprob)
            variant_rows.append([tp.stem, vrow["variant"], vrow["kind"], fmt(vrow["err"], ".3g"),
                                 fmt(vrow["speedup"]), fmt(vrow["ref_ms"]), fmt(vrow["cand_ms"]),
                                 fmt(vrow["load_s"], ".1f"),
                                 "ok" if not vprob else "FAIL: " + "; ".join(vprob)])
            print(f"[variant] {tp.stem}/{vp.stem}: speedup {fmt(vrow['speedup'])} err/tol {fmt(vrow['err'], '.3g')} "
                  f"{'ok' if not vprob else '; '.join(vprob)}", flush=True)

    print()
    print(f"tasks in {root} (threads={args.threads}, atol={args.atol}, rtol={args.rtol}; warm/cold = median "
          f"reference ms with a warm/cold allocator, change = relative L2 change between two input draws, "
          f"frac = share of elements that change, err64 = fp32-vs-fp64 error / tolerance)")
    print_table(["task", "warm_ms", "cold_ms", "change", "frac", "err64", "status"], task_rows)
    if args.variants:
        print(f"variants (err = worst |cand - ref| / (atol + rtol |ref|) over {args.seeds} seeds x 2 distributions; "
              f"speedup = median of {args.rounds} paired ref/cand ratios, {args.alloc} allocator)")
        print_table(["task", "variant", "kind", "err", "speedup", "ref_ms", "cand_ms", "load_s", "status"],
                    variant_rows)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
