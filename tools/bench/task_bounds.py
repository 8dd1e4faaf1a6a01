#!/usr/bin/env python3
"""How far each task's reference (and, given, a candidate) is from the device's limit: the device's
peaks measured here, each task's work in one call counted as the evaluator counts it (the harness's
reference.py, count_work: FLOPs of matrix products, convolutions and attention by dtype, and the
bytes of the inputs and outputs), its lower bound on a call's time, and the reference's measured
time as a fraction of that bound (docs/evaluator.md, the verdict's `work`; issue 89).

  tools/bench/task_bounds.py data/kernelbench/level1 --device cuda:0 --out runs/bench/bounds/l1.jsonl
  tools/bench/task_bounds.py env/tasks/cpu --device cpu

The peaks: measured as the evaluator measures them for a verdict's bound (the harness's
reference.py, measure_peaks: a fill; the fastest of a byte copy, a float32 negation and a ReLU at
1 and 8 GiB moved on CUDA, 64 MiB on the CPU; square matrix products by dtype at two sides), each
rate the fastest of 10 here.
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
import os
import re
import statistics
import sys

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
    harness = load_harness()
    reference = harness["reference"]
    kind = harness["device"].kind_of("cuda" if a.device.startswith("cuda") else "cpu")
    # The evaluator's own measurement (reference.py, measure_peaks: what a verdict's bound uses),
    # each rate the fastest of 10 here.
    peaks = reference.measure_peaks(kind, a.device, reps=10)
    if peaks is None:
        print(f"task_bounds.py: the peaks of {a.device} could not be measured", file=sys.stderr)
        return 1
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
                    times.append(reference.fastest_ms(lambda: model(*inputs), kind, reps=1, warm=0, before=flush))
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
