#!/usr/bin/env python3
"""Precision of crucible's verdicts against a KernelBench-style measurement, side by side.

For each fixed (task, candidate) pair in tools/bench/eval_gpu/, evaluates the candidate N times
with `crucible eval --repeat N --no-cache --json` (each verdict in a fresh worker process) and N
times with a KernelBench-style measurement (1 correctness trial, 100 CUDA-event timings per
model on the current stream, the same inputs reused, no pairing), each in a fresh Python
process as KernelBench's harness runs them. Reports for both: the speedups, their spread
(max/min - 1) and the wall time per verdict. The KernelBench-style wall time counts from loading
the task to the result (torch already imported, the extension already built), so it leaves out
the interpreter and torch start-up that crucible's warm worker pool keeps off its own figure.

  python3 tools/bench/eval_precision.py --crucible build-gpu/tools/crucible --repeat 10
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "eval_gpu")


def load_module(path, name):
    """Executes the Python file at `path` as a module named `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kb_mean_ms(model, inputs, calls=100):
    """KernelBench-style time of one model: 3 untimed calls, then the mean of `calls` CUDA-event
    timings on the current stream, the same inputs reused."""
    import torch

    for _ in range(3):
        model(*inputs)
    torch.cuda.synchronize()
    samples = []
    for _ in range(calls):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        model(*inputs)
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    return sum(samples) / len(samples)


def kernelbench_style(task_path, cand_path, seed):
    """One verdict the way KernelBench's harness measures: no pairing, inputs reused."""
    import torch

    t0 = time.perf_counter()
    task = load_module(task_path, "kb_task")
    cand = load_module(cand_path, "kb_cand")
    torch.manual_seed(seed)
    init = task.get_init_inputs()
    torch.manual_seed(seed)
    ref = task.Model(*init).cuda()
    torch.manual_seed(seed)
    new = cand.ModelNew(*init).cuda()
    torch.manual_seed(seed)
    inputs = [x.cuda() if hasattr(x, "cuda") else x for x in task.get_inputs()]
    with torch.no_grad():
        correct = torch.allclose(ref(*inputs), new(*inputs), atol=1e-2, rtol=1e-2)
        times = {label: kb_mean_ms(model, inputs) for label, model in (("ref", ref), ("cand", new))}
    del inputs, ref, new
    torch.cuda.empty_cache()
    return {"correct": bool(correct), "speedup": times["ref"] / times["cand"], "ref_ms": times["ref"],
            "cand_ms": times["cand"], "wall_s": time.perf_counter() - t0}


def kernelbench_style_process(task_path, cand_path, seed):
    """One KernelBench-style verdict in a fresh Python process."""
    out = subprocess.run([sys.executable, __file__, "--kb-child", task_path, cand_path, str(seed)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def crucible_verdicts(crucible, task_path, cand_path, device, repeat, extra):
    cmd = [crucible, "eval", "--task", task_path, "--candidate", cand_path, "--device", device, "--json",
           "--no-cache", "--repeat", str(repeat)] + extra
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    total = time.perf_counter() - t0
    verdicts = [json.loads(line) for line in out.splitlines() if line.strip()]
    return verdicts, total


def spread(xs):
    return max(xs) / min(xs) - 1 if xs and min(xs) > 0 else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): "
                                        "sequential verdicts against KernelBench-style\n"
                                        "(tools/bench/gpu_session.sh precision runs it). No environment variables.")
    ap.add_argument("--crucible", default="", help="path of the crucible binary")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--only", default="", help="comma-separated task names")
    ap.add_argument("--set", action="append", default=[], help="passed to crucible eval as --set")
    ap.add_argument("--out", default="", help="write all results as JSON here")
    ap.add_argument("--kb-child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.kb_child:
        task_path, cand_path, seed = args.kb_child
        print(json.dumps(kernelbench_style(task_path, cand_path, int(seed))))
        return 0
    if not args.crucible:
        ap.error("--crucible is required")
    extra = [x for s in args.set for x in ("--set", s)]
    names = sorted(f[:-3] for f in os.listdir(os.path.join(SUITE, "tasks")) if f.endswith(".py"))
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    results = []
    for name in names:
        task_path = os.path.join(SUITE, "tasks", name + ".py")
        cand_path = os.path.join(SUITE, "candidates", name + ".py")
        # Warm the compiled-extension cache so neither side pays a build inside the figures.
        crucible_verdicts(args.crucible, task_path, cand_path, args.device, 1, extra)
        ours, ours_total = crucible_verdicts(args.crucible, task_path, cand_path, args.device, args.repeat, extra)
        kernelbench_style_process(task_path, cand_path, 12345)  # builds its own extension cache
        kb = [kernelbench_style_process(task_path, cand_path, seed) for seed in range(args.repeat)]
        ok = [v["speedup"] for v in ours if v["status"] == "ok"]
        row = {
            "task": name,
            "crucible": {"statuses": [v["status"] for v in ours], "speedups": ok, "spread": spread(ok),
                         "band": [v["speedup_spread"] for v in ours], "ref_ms": [v["ref_ms"] for v in ours],
                         "wall_s_per_verdict": statistics.mean(v["wall_s"] for v in ours),
                         "process_wall_s_per_verdict": ours_total / len(ours)},
            "kernelbench_style": {"correct": [k["correct"] for k in kb], "speedups": [k["speedup"] for k in kb],
                                  "spread": spread([k["speedup"] for k in kb]),
                                  "wall_s_per_verdict": statistics.mean(k["wall_s"] for k in kb)},
        }
        results.append(row)
        if args.out:  # after every task, so an interrupted run keeps what it measured
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
        c, k = row["crucible"], row["kernelbench_style"]
        print(f"{name:18s} crucible {statistics.mean(ok) if ok else float('nan'):6.3f}x spread {100 * c['spread']:5.2f}% "
              f"wall {c['wall_s_per_verdict']:6.2f} s | kernelbench-style "
              f"{statistics.mean(k['speedups']):6.3f}x spread {100 * k['spread']:5.2f}% wall {k['wall_s_per_verdict']:6.2f} s",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
