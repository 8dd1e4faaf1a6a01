"""tools/check_tasks.py's checks: a task file -> its row (load, time window, outputs, signal,
stability against float64); a variant file -> its row (static checks, correctness on the
evaluator's input distributions, speedup; on the CPU, optionally its Triton kernels compiled for
sm_90); either one in a child process of its own (run_child runs tools/check_tasks.py --child)."""
from __future__ import annotations

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

import torch

from check_tasks_helpers import (FLOAT_OUTPUTS, LOW_PRECISION, MALLOC, Flusher, Timer, all_finite, as_list,
                                 build_model, drop_unfinite, err_ratio, input_dists, load_module, load_task,
                                 make_inputs, needs_cuda, reference_float64, rounding_slack, signature_problem,
                                 static_findings, sync, timed_dists, tolerance, uses_triton)


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
        cmd = [sys.executable, str(Path(__file__).resolve().with_name("check_tasks.py")), "--child", kind, *paths,
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
