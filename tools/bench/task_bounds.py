#!/usr/bin/env python3
"""How far each task's reference (and, given, a candidate) is from the device's limit: the device's
peaks measured here, each task's work in one call counted as the evaluator counts it (the harness's
reference.py, count_work: FLOPs of matrix products, convolutions and attention by dtype, and the
bytes of the inputs and outputs), its lower bound on a call's time, and the reference's measured
time as a fraction of that bound (docs/evaluator.md, the verdict's `work`; issue 89).

  tools/bench/task_bounds.py data/kernelbench/level1 --device cuda:0 --out runs/bench/bounds/l1.jsonl
  tools/bench/task_bounds.py env/tasks/cpu --device cpu

The peaks: the device's write rate (a fill of 1 GiB on CUDA, 256 MiB on the CPU), its copy rate
(read and write: the fastest of a byte copy, a float32 negation and a ReLU, 1 and 8 GiB moved on
CUDA), and matrix-product rates by dtype (float32 as the harness runs it, TF32 where
the device has tensor cores, float16, bfloat16; float64; two sides each), each the fastest of 10 after a warm-up.
A call's bound is the larger of its bytes at the copy rate and its FLOPs at the fastest rate of
their dtype (float32's at TF32's where the device has it: a candidate may use TF32 where its
outputs stay within tolerance). The FLOP part counts the reference's own algorithm: where the
reference does more than the task needs (a dense product with a diagonal matrix), a candidate can
be faster than it; the bytes part holds for any candidate. No candidate runs here: this is the task's side of the bound, a
plain process without the evaluator's sandbox (tasks from a trusted folder only).

Writes one JSON record a task to --out (default: stdout's summary only) and prints a table: work,
bound, the reference's median time (caches flushed before each call) and its fraction of the
bound (bound / time: 1.0 is at the limit). No environment variables.
"""
import argparse
import importlib.util
import json
import math
import os
import re
import statistics
import sys
import time

import torch

from reference_as_candidate import number  # tasks in the order of their leading number

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_harness():
    """env/eval/harness as the worker loads it (tests/harness/conftest.py's way): worker.py by path,
    its own modules by name."""
    spec = importlib.util.spec_from_file_location("crucible_worker_for_bounds",
                                                  os.path.join(ROOT, "env", "eval", "harness", "worker.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._OWN_MODULES


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def fastest_ms(fn, device, reps=5, warm=2, before=None):
    """The fastest of `reps` timed runs of fn() after `warm` untimed ones (device events on CUDA,
    the host clock on the CPU); `before()`, where given, runs untimed before each."""
    for _ in range(warm):
        fn()
    sync(device)
    best = math.inf
    for _ in range(reps):
        if before:
            before()
            sync(device)
        if device.startswith("cuda"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            best = min(best, (time.perf_counter() - t) * 1e3)
    return best


def measure_peaks(device):
    """Bytes per ms written and copied, and FLOPs per ms of a square matrix product by dtype.

    The copy rate is the fastest of three streaming kernels (a byte copy, float32 negation and ReLU
    into a second buffer) at two sizes (on CUDA 1 GiB and 8 GiB moved, on the CPU 256 MiB), each the
    fastest of 10: one byte copy of 1 GiB (the first version) measured 4.13 TB/s on an H200 where the
    references of KernelBench's elementwise tasks, 12.9 GB a call, moved 4.21 TB/s (fractions of
    1.005-1.020)."""
    cuda = device.startswith("cuda")
    n = (1 << 30) if cuda else (256 << 20)
    buf = torch.empty(n, dtype=torch.uint8, device=device)
    peaks = {"write_bytes_per_ms": n / fastest_ms(lambda: buf.fill_(1), device, reps=10)}
    del buf
    copy = 0.0
    for moved in ((1 << 30, 8 << 30) if cuda else (256 << 20,)):
        half = moved // 2
        src = torch.empty(half, dtype=torch.uint8, device=device).random_(0, 128)
        dst = torch.empty(half, dtype=torch.uint8, device=device)
        fs, fd = src.view(torch.float32), dst.view(torch.float32)
        for fn in (lambda: dst.copy_(src), lambda: torch.neg(fs, out=fd), lambda: torch.clamp_min(fs, 0, out=fd)):
            copy = max(copy, 2 * half / fastest_ms(fn, device, reps=10))
        del src, dst, fs, fd
        if cuda:
            torch.cuda.empty_cache()
    peaks["copy_bytes_per_ms"] = copy
    mm = {}
    kinds = [("float64", torch.float64, False), ("float32", torch.float32, False)]
    if cuda:
        kinds += [("tf32", torch.float32, True), ("float16", torch.float16, False), ("bfloat16", torch.bfloat16, False)]
    else:
        kinds += [("bfloat16", torch.bfloat16, False)]
    for name, dtype, tf32 in kinds:
        # two sides, each the fastest of 10: one square product of side 1024 measured 0.16 TFLOP/s
        # on the 2-core machine where the CPU suite's own products of 512 ran at 0.19
        for side in ((4096, 8192) if cuda else (512, 1024)):
            s = side // 2 if dtype == torch.float64 else side
            a = torch.randn(s, s, device=device).to(dtype)
            b = torch.randn(s, s, device=device).to(dtype)
            old = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            try:
                mm[name] = max(mm.get(name, 0.0), 2.0 * s ** 3 / fastest_ms(lambda: a @ b, device, reps=10))
            finally:
                torch.backends.cuda.matmul.allow_tf32 = old
            del a, b
    peaks["matmul_flops_per_ms"] = mm
    return peaks


def bound_ms(work, peaks):
    """The larger of the call's bytes at the copy rate and its FLOPs at their dtype's fastest rate."""
    mm = peaks["matmul_flops_per_ms"]
    moved = (work["bytes_read"] + work["bytes_written"]) / peaks["copy_bytes_per_ms"]
    compute = 0.0
    for dtype, flops in work["flops"].items():
        rates = [mm[k] for k in ((dtype, "tf32") if dtype == "float32" else (dtype,)) if k in mm]
        rate = max(rates) if rates else max(mm.values())
        compute += flops / rate
    return max(moved, compute), moved, compute


def load_task(path):
    spec = importlib.util.spec_from_file_location("task_" + re.sub(r"\W", "_", os.path.basename(path)[:-3]), path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Reproduces (docs/PERFORMANCE.md): the bound of every task of a suite "
                                        "on the machine it runs on (issue 89). No environment variables.")
    ap.add_argument("tasks", help="folder of task files (class Model, get_inputs, get_init_inputs)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda:N (default cpu)")
    ap.add_argument("--out", help="JSONL of the peaks (first line) and one record a task")
    ap.add_argument("--limit", type=int, default=0, help="the first N tasks by their leading number")
    ap.add_argument("--reps", type=int, default=10, help="timed calls of each reference (median)")
    a = ap.parse_args()
    torch.manual_seed(0)
    reference = load_harness()["reference"]
    peaks = measure_peaks(a.device)
    rows = [{"peaks": peaks, "device": a.device,
             "hardware": torch.cuda.get_device_name(a.device) if a.device.startswith("cuda") else "cpu"}]
    print(f"peaks on {rows[0]['hardware']}: write {peaks['write_bytes_per_ms'] / 1e9:.2f} TB/s, copy "
          f"{peaks['copy_bytes_per_ms'] / 1e9:.2f} TB/s, matmul "
          + ", ".join(f"{k} {v / 1e9:.1f} TFLOP/s" for k, v in peaks["matmul_flops_per_ms"].items()))
    out = None
    if a.out:  # written as the tasks go: a run cut short keeps what it measured
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        out = open(a.out, "w")
        out.write(json.dumps(rows[0]) + "\n")
        out.flush()
    # The caches flushed before each timed call, as the evaluator does (a buffer of 256 MiB written
    # on CUDA, 64 MiB on the CPU): a bound on bytes from memory holds only for calls that read them
    # from there (06_rmsnorm's reference, 16.8 MB, measured 1.33 of its bound back to back).
    scrub = torch.empty((256 if a.device.startswith("cuda") else 64) << 20, dtype=torch.uint8, device=a.device)
    flush = lambda: scrub.fill_(1)
    names = sorted((f for f in os.listdir(a.tasks) if f.endswith(".py")), key=number)
    if a.limit:
        names = names[:a.limit]
    print(f"{'task':44} {'GFLOP':>9} {'MB moved':>9} {'bound ms':>9} {'ref ms':>9} {'fraction':>8}")
    for name in names:
        row = {"task": name}
        try:
            mod = load_task(os.path.join(a.tasks, name))
            model = mod.Model(*mod.get_init_inputs()).to(a.device).eval()
            inputs = [x.to(a.device) if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
            with torch.no_grad():
                work = reference.count_work(model, inputs, set())
                if work is None:
                    raise RuntimeError("the work could not be counted")
                model(*inputs)
                times = []
                for _ in range(a.reps):
                    times.append(fastest_ms(lambda: model(*inputs), a.device, reps=1, warm=0, before=flush))
            ref_ms = statistics.median(times)
            b, moved, compute = bound_ms(work, peaks)
            row.update(work=work, bound_ms=b, bound_bytes_ms=moved, bound_flops_ms=compute, ref_ms=ref_ms,
                       ref_fraction=b / ref_ms if ref_ms > 0 else None)
            print(f"{name[:44]:44} {sum(work['flops'].values()) / 1e9:9.2f} "
                  f"{(work['bytes_read'] + work['bytes_written']) / 1e6:9.1f} {b:9.4f} {ref_ms:9.4f} {b / ref_ms:8.3f}")
        except Exception as e:  # a task that does not run here is named, not fatal
            row["error"] = f"{type(e).__name__}: {e}"[:300]
            print(f"{name[:44]:44} error: {row['error'][:80]}")
        rows.append(row)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
        model = inputs = None
        if a.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
