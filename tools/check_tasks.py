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
  static   the evaluator's static anti-hacking checks (env/harness/static_checks.py) find nothing;
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

Inputs are the evaluator's: its worker's own make_inputs (env/harness/reference.py; the worker,
env/harness/worker.py, is loaded by path, which loads the harness's modules in its order, as
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
import ctypes
import ctypes.util
import importlib.util
import inspect
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
LOW_PRECISION = (torch.float16, torch.bfloat16)
FLOAT_OUTPUTS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------- helpers

def load_module(path: Path, tag: str):
    name = f"_check_{tag}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def apply_shrink(mod, factor: int) -> dict:
    """Divides the module's UPPER_CASE int constants >= 128 by `factor`; returns what changed."""
    changed = {}
    if factor <= 1:
        return changed
    for name, val in list(vars(mod).items()):
        if name.isupper() and type(val) is int and val >= 128:
            setattr(mod, name, max(1, val // factor))
            changed[name] = (val, val // factor)
    return changed


def load_task(path: Path, args):
    task = load_module(path, "task")
    apply_shrink(task, args.shrink)
    return task


_WORKER = None


def evaluator_worker():
    """env/harness/worker.py, loaded by path once per process: its import loads the harness's
    modules in its own order (reference.py's make_inputs, static_checks.py), starts no worker and
    touches no device."""
    global _WORKER
    if _WORKER is None:
        spec = importlib.util.spec_from_file_location("crucible_worker", REPO / "env" / "harness" / "worker.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _WORKER = mod
    return _WORKER


def make_inputs(task, seed: int, dist: int, device: str):
    """The evaluator's inputs: its worker's make_inputs (get_inputs() under `seed` inside `with
    torch.device(device)`, moved to the device, then input distribution `dist`)."""
    return evaluator_worker()._OWN_MODULES["reference"].make_inputs(task, device, seed, dist)


def input_dists(task) -> list[int]:
    """The input distributions the evaluator draws the task's trials from, in its order
    (reference.py, reference_phase), before it leaves out those where the reference's outputs
    are not finite (drop_unfinite)."""
    domain = getattr(task, "INPUT_DOMAIN", "any")
    if domain not in ("any", "as-given"):
        raise RuntimeError(f"the task's INPUT_DOMAIN is {domain!r}; it must be 'any' or 'as-given'")
    return [0, 5, 2, 3, 4] if domain == "any" else [0, 1, 4]


def all_finite(outs) -> bool:
    return all(not (isinstance(y, torch.Tensor) and y.is_floating_point()) or bool(torch.isfinite(y).all())
               for y in outs)


def drop_unfinite(dists: list[int], dist: int, outs, finite0: bool) -> bool:
    """As the evaluator does (reference.py, reference_phase): distribution 2, 3 or 4 is left out
    of `dists` (True) where the reference's outputs `outs` on it are not finite while they were on
    distribution 0 (`finite0`: the first trial's, and only where the task draws more than 0 and 1);
    5 gives way to 1."""
    if dist >= 2 and finite0 and not all_finite(outs):
        if dist == 5:
            dists[dists.index(5)] = 1
        else:
            dists.remove(dist)
        return True
    return False


# evaluator.rounding_factor's default (core/config.hpp): the evaluator widens atol for each
# floating output by this times the reference's own rounding error on the trial's inputs.
ROUNDING_FACTOR = 8.0


def reference_float64(model):
    """The worker's float64 copy of the reference (reference.py, reference_float64), or None
    where it cannot be made (the evaluator's tolerances then stay fixed)."""
    return evaluator_worker()._OWN_MODULES["reference"].reference_float64(model, ROUNDING_FACTOR, {})


def rounding_slack(model64, inputs, ref) -> list[float]:
    """The evaluator's widening of atol per output for the reference's outputs `ref` on
    `inputs` (env/compare.cpp): ROUNDING_FACTOR times the reference's own rounding error there,
    measured by the worker's rounding_error against the float64 copy `model64`; [] (tolerances
    fixed) where there is no copy or its call fails."""
    if model64 is None:
        return []
    errs = evaluator_worker()._OWN_MODULES["reference"].rounding_error(model64, inputs, ref, lambda: None, {})
    return [] if errs is None else [ROUNDING_FACTOR * e for e in errs]


def timed_dists(dists: list[int]) -> list[int]:
    """The distributions of the timed rounds, in turn: all but the task's own (0), as the
    evaluator's boundary draws them."""
    return [d for d in dists if d != 0] or [1]


def build_model(cls, task, device: str):
    torch.manual_seed(0)
    return cls(*task.get_init_inputs()).to(device)


def as_list(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return list(out)
    raise TypeError(f"forward returned {type(out).__name__}, not a tensor or a tuple of tensors")


def tolerance(dtype, args):
    if dtype in LOW_PRECISION:
        return args.lp_atol, args.lp_rtol
    return args.atol, args.rtol


def err_ratio(cand, ref, args, exact: bool = False, slack=()) -> float:
    """max |c - r| / (atol + slack + rtol |r|) over all outputs with the tolerance of each
    output's dtype, atol widened by slack[i] for output i (rounding_slack; none past its end)
    (exact: any difference counts); inf on a shape/dtype/finiteness mismatch."""
    worst = 0.0
    if len(cand) != len(ref):
        return math.inf
    for i, (c, r) in enumerate(zip(cand, ref)):
        if type(c) is not torch.Tensor or c.shape != r.shape or c.dtype != r.dtype:
            return math.inf
        if c.numel() == 0:
            continue
        c64, r64 = c.double(), r.double()
        if not torch.isfinite(c64).all():
            return math.inf
        d = (c64 - r64).abs()
        if exact:
            ratio = math.inf if d.max().item() > 0 else 0.0
        else:
            atol, rtol = tolerance(r.dtype, args)
            if i < len(slack):
                atol += slack[i]
            ratio = (d / (atol + rtol * r64.abs())).max().item()
        worst = max(worst, ratio)
    return worst


def sync(device: str):
    if device == "cuda":
        torch.cuda.synchronize()


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
    """Evicts the caches by writing a buffer larger than the last-level cache (64 MiB on the
    CPU, 256 MiB on CUDA, as the evaluator does)."""

    def __init__(self, enabled: bool, device: str):
        mib = 256 if device == "cuda" else 64
        self.buf = torch.empty(mib * 1024 * 1024 // 4, dtype=torch.float32, device=device) if enabled else None

    def __call__(self):
        if self.buf is not None:
            self.buf.fill_(1.0)


class Timer:
    def __init__(self, device: str, flush: Flusher):
        self.device = device
        self.flush = flush
        if device == "cuda":
            self.start = torch.cuda.Event(enable_timing=True)
            self.stop = torch.cuda.Event(enable_timing=True)

    def __call__(self, fn, inputs) -> float:
        """Milliseconds of one call, caches flushed before it."""
        if self.device == "cuda":
            self.flush()
            self.start.record()
            fn(*inputs)
            self.stop.record()
            torch.cuda.synchronize()
            return self.start.elapsed_time(self.stop)
        self.flush()
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


def static_findings(src: str, task_src: str) -> list[str]:
    """The evaluator's static checks on a candidate's source (the worker's static_checks.py)."""
    check_source = evaluator_worker()._STATIC_CHECKS_MODULE.check_source
    return [f"static check {name} (line {line}): {msg}" for name, line, msg in check_source(src, task_src)]


def needs_cuda(src: str) -> bool:
    return "cuda_sources" in src


def uses_triton(src: str) -> bool:
    return "import triton" in src or "from triton" in src


def fmt(x, spec=".2f"):
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x in ("inf", "-inf"):  # an infinity as a child's row carries it (json_safe)
        return x
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


def json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


# ----------------------------------------------------------------------------- task checks

def check_task(path: Path, name: str, args):
    """Returns (row, task module or None, reference model or None); row["problems"] lists failures."""
    dev = args.device
    problems = []
    row = {"task": name, "ok": False, "problems": problems, "ref_ms": None, "ref_warm_ms": None,
           "ref_cold_ms": None, "change": None, "frac": None, "err64": None, "dtypes": None, "dists": None}
    try:
        task = load_task(path, args)
        for attr in ("Model", "get_inputs", "get_init_inputs"):
            if not hasattr(task, attr):
                raise RuntimeError(f"missing {attr}")
        dists = input_dists(task)
        if not (task.__doc__ or "").strip():
            problems.append("no docstring")
        model = build_model(task.Model, task, dev)
    except Exception as e:  # noqa: BLE001
        problems.append(f"load: {type(e).__name__}: {e}")
        return row, None, None

    with torch.no_grad():
        try:
            outs = {}  # distribution 0's; the others' are computed again where needed
            finite0 = None
            for seed in (args.seed, args.seed + 1):
                for dist in list(dists):
                    if dist not in dists:
                        continue
                    out = as_list(model(*make_inputs(task, seed, dist, dev)))
                    if finite0 is None:
                        finite0 = len(dists) > 2 and all_finite(out)
                    drop_unfinite(dists, dist, out, finite0)
                    if dist == 0:
                        outs[seed, dist] = out
                    del out
            sync(dev)
            row["dists"] = list(dists)
        except Exception as e:  # noqa: BLE001
            problems.append(f"run: {type(e).__name__}: {e}")
            return row, task, None

        # output type and spread
        first = outs[args.seed, 0]
        row["dtypes"] = [str(y.dtype).replace("torch.", "") if isinstance(y, torch.Tensor) else type(y).__name__
                         for y in first]
        for i, y in enumerate(first):
            if type(y) is not torch.Tensor or y.dtype not in FLOAT_OUTPUTS:
                problems.append(f"output {i} is not a float32/float16/bfloat16 tensor")
                continue
            if not torch.isfinite(y).all():
                problems.append(f"output {i} has non-finite values")
            if y.numel() > 1:
                std = y.double().std().item()
                scale = y.double().abs().mean().item()
                if not std > 1e-6 or std < 1e-3 * scale:
                    problems.append(f"low signal: output {i} is nearly constant (std {std:.3g}, mean |y| {scale:.3g})")
        if problems:
            return row, task, model

        # dependence on the inputs: two independent draws
        a, b = outs[args.seed, 0], outs[args.seed + 1, 0]
        change, frac = math.inf, 1.0
        for ya, yb in zip(a, b):
            atol, rtol = tolerance(yb.dtype, args)
            ya, yb = ya.double(), yb.double()
            denom = max(ya.norm().item(), yb.norm().item(), 1e-30)
            change = min(change, (ya - yb).norm().item() / denom)
            differs = (ya - yb).abs() > (atol + rtol * yb.abs())
            frac = min(frac, differs.double().mean().item())
        row["change"], row["frac"] = change, frac
        if change < args.min_change:
            problems.append(f"low signal: output barely depends on the inputs (relative change {change:.3g} "
                            f"between two input draws, min {args.min_change})")
        if frac < args.min_frac:
            problems.append(f"low signal: only {frac:.0%} of output elements change beyond the tolerance "
                            f"between two input draws (min {args.min_frac:.0%})")

        # determinism
        again = as_list(model(*make_inputs(task, args.seed, 0, dev)))
        if err_ratio(again, outs[args.seed, 0], args) > 1:
            problems.append("reference is not deterministic")
        del again

        # numerical stability against float64
        worst = 0.0
        lp = any(y.dtype in LOW_PRECISION for y in first)
        limit = args.max_err_ratio_lp if lp else args.max_err_ratio
        try:
            model64 = build_model(task.Model, task, dev).double()
            # On the task's own scale (distributions 0 and 1): a rewrite as precise as the
            # reference passes there with the tolerance alone. (On every distribution the
            # evaluator also widens atol by the reference's own rounding error, rounding_slack.)
            for seed in (args.seed, args.seed + 1):
                for dist in (0, 1):
                    inp = make_inputs(task, seed, dist, dev)
                    ref = outs[seed, 0] if dist == 0 else as_list(model(*inp))
                    inp64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                             for x in inp]
                    del inp
                    y64 = [y.to(r.dtype) for y, r in zip(as_list(model64(*inp64)), ref)]
                    del inp64
                    # the reference against float64 rounded to its dtype, in the evaluator's metric
                    worst = max(worst, err_ratio(ref, y64, args))
                    del y64, ref
            del model64
        except Exception as e:  # noqa: BLE001
            problems.append(f"float64 run failed: {type(e).__name__}: {e}")
        row["err64"] = worst
        if worst > limit:
            problems.append(f"reference vs float64 error is {worst:.2f} of the tolerance (max {limit})")
        del outs, a, b, first
        if dev == "cuda":
            torch.cuda.empty_cache()

        if not args.no_timing:
            flush = Flusher(not args.no_flush, dev)
            timer = Timer(dev, flush)
            inp = make_inputs(task, args.seed, 0, dev)
            if dev == "cuda":
                for _ in range(args.warmup + 1):
                    model(*inp)
                sync(dev)
                row["ref_ms"] = statistics.median(timer(model, inp) for _ in range(args.ref_reps))
                if row["ref_ms"] < args.min_ms:
                    problems.append(f"reference takes {row['ref_ms']:.3f} ms, below {args.min_ms} ms")
                if row["ref_ms"] > args.max_ms:
                    problems.append(f"reference takes {row['ref_ms']:.1f} ms, above {args.max_ms} ms")
            else:
                # reference time with a warm and with a cold allocator
                for regime in ("warm", "cold"):
                    MALLOC.set(regime)
                    for _ in range(2):
                        model(*inp)
                    row[f"ref_{regime}_ms"] = statistics.median(timer(model, inp) for _ in range(args.ref_reps))
                MALLOC.set(args.alloc)
                row["ref_ms"] = row["ref_warm_ms"]
                if row["ref_warm_ms"] < args.min_ms:
                    problems.append(f"reference takes {row['ref_warm_ms']:.2f} ms (warm allocator), below {args.min_ms} ms")
                if row["ref_cold_ms"] > args.max_ms:
                    problems.append(f"reference takes {row['ref_cold_ms']:.2f} ms (cold allocator), above {args.max_ms} ms")
    row["ok"] = not problems
    return row, task, model


# ----------------------------------------------------------------------------- variant checks

def check_variant(vpath: Path, task_path: Path, task, model, args):
    dev = args.device
    wrong = vpath.stem.startswith("wrong_")
    problems = []
    row = {"variant": vpath.stem, "kind": "wrong" if wrong else "correct", "ok": False, "problems": problems,
           "status": None, "err": None, "speedup": None, "ref_ms": None, "cand_ms": None, "load_s": None}
    src = vpath.read_text()
    problems += static_findings(src, task_path.read_text())
    if not (ast_docstring(src) or "").strip():
        problems.append("no docstring")
    cuda_only = needs_cuda(src)
    if cuda_only and dev != "cuda" and not args.build_cuda:
        row["status"] = "skipped: needs CUDA (--build-cuda builds it)"
        row["ok"] = not problems
        return row
    try:
        t0 = time.perf_counter()
        mod = load_module(vpath, "variant")
        row["load_s"] = time.perf_counter() - t0
        if not hasattr(mod, "ModelNew"):
            raise RuntimeError("no ModelNew")
        sig = signature_problem(task.Model, mod.ModelNew)
        if sig:
            problems.append(sig)
        if cuda_only and dev != "cuda":
            row["status"] = "built, not run: needs CUDA"
            row["ok"] = not problems
            return row
        cand = build_model(mod.ModelNew, task, dev)
    except Exception as e:  # noqa: BLE001
        problems.append(f"load: {type(e).__name__}: {e}")
        if args.verbose:
            traceback.print_exc()
        return row

    if dev == "cpu" and uses_triton(src) and getattr(args, "compile_triton", False):
        # in a child of its own: a process that imported triton under TRITON_INTERPRET=1 holds
        # interpreted versions of triton.language's own @jit functions and cannot compile
        res = run_child("compile", [str(task_path), "-", str(vpath)], args, args.timeout, interpret=False)
        problems += res.get("problems", [])
        row["sm90_kernels"] = res.get("kernels", 0)

    with torch.no_grad():
        worst = 0.0
        failed_on = []
        dists = [0, 1]
        try:
            dists = input_dists(task)
            model64 = reference_float64(model)
            finite0 = None
            for s in range(args.seeds):
                seed = args.seed + 100 + s
                for dist in list(dists):
                    if dist not in dists:
                        continue
                    inp = make_inputs(task, seed, dist, dev)
                    ref = as_list(model(*inp))
                    if finite0 is None:
                        finite0 = len(dists) > 2 and all_finite(ref)
                    if drop_unfinite(dists, dist, ref, finite0):
                        del inp, ref
                        continue
                    slack = rounding_slack(model64, inp, ref)
                    kept = [x.clone() if isinstance(x, torch.Tensor) else x for x in inp]
                    out = as_list(cand(*inp))
                    sync(dev)
                    r = err_ratio(out, ref, args, slack=slack)
                    lowp_out = any(isinstance(y, torch.Tensor) and y.dtype in LOW_PRECISION for y in ref)
                    worst = max(worst, r)
                    if r > 1.0:
                        failed_on.append((seed, dist))
                    if s == 0 and dist == 0 and not wrong:
                        again = as_list(cand(*inp))
                        if err_ratio(again, out, args) > 1.0:
                            problems.append("not deterministic: a second call on the same inputs differs")
                        del again
                    for x, k in zip(inp, kept):
                        if isinstance(x, torch.Tensor) and not torch.equal(x, k):
                            problems.append("changes its inputs")
                            break
                    del inp, ref, kept, out
            del model64
        except Exception as e:  # noqa: BLE001
            if wrong:
                worst = math.inf
                failed_on.append(("exception", str(e)[:60]))
            else:
                problems.append(f"run: {type(e).__name__}: {e}")
                if args.verbose:
                    traceback.print_exc()
                return row
        row["err"] = worst
        if wrong:
            if not failed_on:
                problems.append(f"wrong variant passes the tolerance (worst {worst:.2f} of tol)")
            row["problems"] = sorted(set(problems))
            row["ok"] = not row["problems"]
            return row
        if failed_on:
            note = ""
            if dev == "cpu" and uses_triton(src) and lowp_out:
                note = (" (Triton's interpreter truncates float32 -> float16/bfloat16 conversions where the GPU "
                        "rounds to nearest: check on CUDA)")
            problems.append(f"out of tolerance ({worst:.3g} x tol) on (seed, dist) {failed_on[:3]}{note}")

        if args.no_timing or (dev == "cpu" and uses_triton(src)):
            row["status"] = "not timed" + (" (Triton interpreter)" if not args.no_timing else "")
            if row.get("sm90_kernels"):
                row["status"] += f"; {row['sm90_kernels']} kernel(s) compiled for sm_90"
        else:
            # paired, interleaved timing; fresh inputs each round, random order
            timer = Timer(dev, Flusher(not args.no_flush, dev))
            inp = make_inputs(task, args.seed, 0, dev)
            for _ in range(args.warmup):
                model(*inp)
                cand(*inp)
            sync(dev)
            rng = random.Random(args.seed)
            ratios, tr, tc = [], [], []
            timed = timed_dists(dists)
            for i in range(args.rounds):
                inp = make_inputs(task, args.seed + 1000 + i, timed[i % len(timed)], dev)
                sync(dev)
                if rng.random() < 0.5:
                    a = timer(model, inp)
                    b = timer(cand, inp)
                else:
                    b = timer(cand, inp)
                    a = timer(model, inp)
                tr.append(a)
                tc.append(b)
                ratios.append(a / b)
            row["speedup"] = statistics.median(ratios)
            row["ref_ms"] = statistics.median(tr)
            row["cand_ms"] = statistics.median(tc)
            if row["speedup"] < args.min_speedup:
                problems.append(f"speedup {row['speedup']:.2f}x below {args.min_speedup}x")
    row["problems"] = sorted(set(problems))
    row["ok"] = not row["problems"]
    return row


def ast_docstring(src: str) -> str | None:
    import ast
    try:
        return ast.get_docstring(ast.parse(src))
    except SyntaxError:
        return None


_TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
                 torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
                 torch.bool: "i1"}


def compile_triton_sm90(vpath: Path, task, inputs) -> tuple[list[str], int]:
    """Imports the variant with Triton's JIT (not its interpreter: call it in a process where
    TRITON_INTERPRET is not set) and runs ModelNew.forward on
    `inputs` with every kernel launch replaced by a compilation for sm_90 (Triton's own ptxas,
    no GPU needed); returns the problems found and the number of kernels compiled. The
    forward's outputs are not used."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    compiled = {}

    def launch(self, *a, grid, warmup, **kw):
        opts = {k: kw.pop(k) for k in ("num_warps", "num_stages", "num_ctas") if k in kw}
        bound = dict(zip(self.arg_names, a))
        bound.update(kw)
        sig, consts = {}, {}
        for i, pname in enumerate(self.arg_names):
            v = bound[pname]
            if self.params[i].is_constexpr:
                sig[pname], consts[pname] = "constexpr", v
            elif isinstance(v, torch.Tensor):
                sig[pname] = "*" + _TRITON_TYPES[v.dtype]
            elif isinstance(v, bool):
                sig[pname] = "i1"
            elif isinstance(v, int):
                sig[pname] = "i32" if -(1 << 31) <= v < (1 << 31) else "i64"
            elif isinstance(v, float):
                sig[pname] = "fp32"
            else:
                raise TypeError(f"{self.fn.__name__}: cannot type argument {pname} ({type(v).__name__})")
        key = (self.fn.__name__, tuple(sig.items()), tuple(sorted(consts.items())), tuple(sorted(opts.items())))
        if key not in compiled:
            compiled[key] = triton.compile(ASTSource(self, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                                           options=opts)
        return None

    problems = []
    old_run = JITFunction.run
    try:
        mod = load_module(vpath, "variant_sm90")
        JITFunction.run = launch
        with torch.no_grad():
            build_model(mod.ModelNew, task, "cpu")(*inputs)
        if not compiled:
            problems.append("Triton compile for sm_90: no kernel was launched")
    except Exception as e:  # noqa: BLE001
        problems.append(f"Triton compile for sm_90: {type(e).__name__}: {str(e)[:300]}")
    finally:
        JITFunction.run = old_run
    return problems, len(compiled)


# ----------------------------------------------------------------------------- isolation

def run_child(kind: str, paths: list[str], args, timeout: float, interpret: bool = True) -> dict:
    """Runs one check in a child process (its own session); returns its row, or a failure row
    when it crashed, timed out or wrote nothing."""
    with tempfile.TemporaryDirectory(prefix="check_tasks_") as tmp:
        out = Path(tmp) / "row.json"
        opts = {k: v for k, v in vars(args).items() if k not in ("child", "child_out", "child_args")}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, *paths,
               "--child-out", str(out), "--child-args", json.dumps(opts)]
        t0 = time.monotonic()
        env = dict(os.environ)
        if not interpret:
            env.pop("TRITON_INTERPRET", None)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                text=True, errors="replace", env=env)
        try:
            log, _ = proc.communicate(timeout=timeout)
            failure = None if proc.returncode == 0 else f"child exited with status {proc.returncode}"
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            log, _ = proc.communicate()
            failure = f"timed out after {timeout:.0f} s"
        if args.verbose and log:
            sys.stdout.write(log)
        row = None
        if out.exists():
            try:
                row = json.loads(out.read_text())
            except ValueError:
                row = None
        if row is None:
            tail = " | ".join(line for line in (log or "").strip().splitlines()[-3:])
            row = {"ok": False, "problems": [f"{failure or 'child wrote no result'}: {tail[-400:]}"]}
        elif failure and row.get("ok"):
            row["ok"] = False
            row["problems"] = row.get("problems", []) + [failure]
        row["wall_s"] = round(time.monotonic() - t0, 1)
        return row


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
    # the evaluator's worker's fixed backend settings (env/harness/worker.py): no TF32 anywhere
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
