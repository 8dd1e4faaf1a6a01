"""tools/check_tasks.py's helpers: a task file -> its module (shrunk with --shrink) and the
evaluator's inputs for it (its worker's make_inputs, input distributions, rounding slack); outputs
-> their error over the tolerance; the CPU allocator regimes, the cache flush and the timer; the
candidate's signature and static checks; the table and JSON formats."""
from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import inspect
import math
import sys
import time
from pathlib import Path

import torch

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
    """env/eval/harness/worker.py, loaded by path once per process: its import loads the harness's
    modules in its own order (reference.py's make_inputs, static_checks.py), starts no worker and
    touches no device."""
    global _WORKER
    if _WORKER is None:
        spec = importlib.util.spec_from_file_location("crucible_worker", REPO / "env" / "eval" / "harness" / "worker.py")
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
    `inputs` (env/eval/compare.cpp): ROUNDING_FACTOR times the reference's own rounding error there,
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
