#!/usr/bin/env python3
"""Judges a set of (task, candidate) pairs the way KernelBench's own harness does, one record a pair,
for a side-by-side with `crucible eval --pairs` (tools/bench/compare_timing.py joins the two).

Follows ScalingIntelligence/KernelBench at commit 423217d9fda91e0c2d67e4a43bf62f96f6d104f1
(2026-03-05): src/kernelbench/eval.py (eval_kernel_against_ref, run_and_check_correctness),
src/kernelbench/timing.py (time_execution_with_cuda_event, measure_ref_program_time,
get_timing_stats) and scripts/run_and_check.py (its pair tool). What is copied:

  loading     the task's source exec'd into a fresh dict; the candidate's exec'd into the same dict
              (KernelBench's "cuda" backend; a candidate may use the task's names), or, for a Triton
              candidate, imported from a temporary file (its "triton" backend). --backend auto picks
              the second where the candidate's source mentions triton; KernelBench's caller names
              the backend for a whole run instead.
  seeding     seed 42: torch.manual_seed and torch.cuda.manual_seed before get_init_inputs(), before
              Model(*init) and before ModelNew(*init) (both built under torch.no_grad()).
  precision   every tensor input, integer ones included, cast to fp32 (--precision) and moved to the
              device; both models .to(device, dtype).
  correctness --correct-trials (5, the scripts' default): trial seeds drawn by torch.randint after
              torch.manual_seed(42); per trial set_seed(trial seed), get_inputs(), the reference's
              forward then the candidate's on the same tensors, under torch.no_grad(); a shape
              mismatch or an exception ends the check; torch.allclose with atol = rtol = 1e-4 for
              fp32 (1e-2 for fp16/bf16); correct only when every trial passes.
  failures    an exception loading the candidate is compiled=false; a RuntimeError building ModelNew
              or any exception in the trials is compiled=true, correctness=false (runtime_error);
              any other exception escaping the eval is compiled=false (eval_from_generations.py's
              last-level catch: cuda_error or other_error).
  timing      only for a correct candidate; set_seed(42), get_inputs() once, reused by every call;
              time_execution_with_cuda_event: 3 warm-up calls each followed by a device
              synchronisation, torch.cuda.empty_cache(), then --trials (100) + 1 timed calls of
              which the first is discarded; each: synchronize, a 256 MiB int64 tensor filled with
              42 (the L2 flush, queued before the start event), start event, the call, end event on
              the current stream, synchronize, elapsed_time. Timed with autograd on (the eval's
              timing is outside no_grad). No input cloning, no output checks.
  statistic   get_timing_stats: the mean of the per-trial ms, and its std (numpy, ddof 0), each
              rounded to 3 significant figures; speedup = reference mean / candidate mean, of the
              rounded means.
  reference   two timings, both recorded: `ref_ms` as run_and_check.py measures it, by
              measure_ref_program_time (a fresh Model from the same source, set_seed(42) before
              get_inputs() and again before get_init_inputs(), under no_grad, 5 warm-up calls,
              --trials + 1 discarded, eager); and `eval_ref_ms` as eval_kernel_against_ref times
              the reference for its excessive-speedup flag (the instance checked for correctness,
              the candidate's inputs, 3 warm-up calls, autograd on). `speedup` is run_and_check.py's
              (ref_ms / cand_ms), `speedup_eval` the eval's; `excessive_speedup` marks the eval's
              speedup above 10x as KernelBench's metadata does.

Not copied: KernelBench's static checker (run_and_check.py's check_kernel), its build cache
directories (--build-dir sets TORCH_EXTENSIONS_DIR the way its build_dir does) and its
reference timings from a baseline JSON file.

Additions: --eval-mode calls .eval() on every model once it is built, as CUDA-L1's variant of the
harness does. On the CPU (--device cpu, for smoke tests) the same steps run with
time.perf_counter_ns around each call in place of the events (the flush is a 256 MiB host tensor).
Each pair runs in its own Python process (this file re-invoked), killed with its process group after
--timeout seconds, so a crash or a CUDA error costs only its pair.

Usage:
  tools/bench/kernelbench_timing.py --pairs PAIRS.tsv --device cuda:0 --out kb.jsonl
  tools/bench/kernelbench_timing.py --pairs h100.json --device cuda:0 --out kb.jsonl --eval-mode
  tools/bench/kernelbench_timing.py --pairs PAIRS.tsv --device cpu --trials 5 --correct-trials 2 \\
      --out /tmp/kb.jsonl

Pairs: a TSV (task path TAB candidate path a line, '#' comments and blank lines skipped, relative
paths joined to the TSV's folder, a pair listed twice judged once) or a JSONL/JSON file in CUDA-L1's
layout (level_id, task_id, ref_code, custom_code a line; a null, empty or "None" custom_code gives an
error record). Pair labels are those `crucible eval --pairs` writes for the same file: task and
candidate paths for a TSV, "levelL/T" and "FILE:LINE" for JSONL.

Records (--out, one JSON object a line, appended as each pair ends; a rerun skips pairs already
recorded, by task and candidate for a TSV, by line, level_id and task_id for JSONL): pair, task,
candidate, line, level_id/task_id (JSONL), device, hardware, compiled, correctness, status (ok,
incorrect, compile_error, runtime_error, timeout, error: KernelBench's two booleans in crucible's
words), error, ref_ms/ref_std, cand_ms/cand_std, speedup, eval_ref_ms/eval_ref_std, speedup_eval,
excessive_speedup, ref_stats/cand_stats/eval_ref_stats (mean, std, min, max, num_trials, and the
mean before rounding), metadata (KernelBench's: correctness_trials, max_difference, ...), trials,
correct_trials, eval_mode, backend, wall_s, kernelbench_commit, input (JSONL: the line's other
fields).
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

KERNELBENCH_COMMIT = "423217d9fda91e0c2d67e4a43bf62f96f6d104f1"
SEED = 42                 # eval_kernel_against_ref's seed_num default
EVAL_WARMUP = 3           # time_execution_with_cuda_event's num_warmup default (the eval passes none)
REF_WARMUP = 5            # measure_ref_program_time's num_warmup default
DISCARD_FIRST = 1         # both timing paths' discard_first default
EXCESSIVE_SPEEDUP = 10.0  # eval_kernel_against_ref's excessive_speedup_threshold
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}  # get_tolerance_for_precision


# -- the pairs ------------------------------------------------------------------------------------

def _task_parts_missing(src):
    missing = [name for name, pat in (("class Model", r"^class\s+Model\b"),
                                      ("get_inputs", r"^def\s+get_inputs\b"),
                                      ("get_init_inputs", r"^def\s+get_init_inputs\b"))
               if not re.search(pat, src, re.M)]
    return ", ".join(missing)


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def load_tsv(path):
    """Pairs of a TSV, labelled as crucible labels them (paths joined to the TSV's folder)."""
    base = os.path.dirname(path)
    pairs, seen = [], {}
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.strip().startswith("#"):
            continue
        fields = [x.strip() for x in line.split("\t")]
        if len(fields) != 2 or not all(fields):
            sys.exit(f"{path}:{n}: expected TASK<TAB>CANDIDATE, got {len(fields)} field(s)")
        task, cand = (os.path.normpath(os.path.join(base, p)) for p in fields)
        if (task, cand) in seen:
            print(f"{path}:{n}: the same pair as line {seen[(task, cand)]}: judged once", file=sys.stderr)
            continue
        seen[(task, cand)] = n
        p = {"form": "tsv", "line": n, "task": task, "candidate": cand, "problem": None}
        try:
            p["ref_src"] = _read(task)
            missing = _task_parts_missing(p["ref_src"])
            if missing:
                p["problem"] = f"task: not a KernelBench task: missing {missing}"
        except OSError as e:
            p["problem"] = f"task: {e}"
        if p["problem"] is None:
            try:
                p["cand_src"] = _read(cand)
            except OSError as e:
                p["problem"] = f"candidate: {e}"
        pairs.append(p)
    return pairs


def load_jsonl(path):
    """Pairs of a CUDA-L1 release file, labelled as crucible labels them."""
    pairs = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"{path}:{n}: not JSON ({e}); expected one JSON object a line")
        if not isinstance(doc, dict):
            sys.exit(f"{path}:{n}: a JSON {type(doc).__name__}, expected an object with ref_code and custom_code")
        for key in ("ref_code", "custom_code"):
            if key not in doc:
                sys.exit(f"{path}:{n}: no {key}")
        if not isinstance(doc["ref_code"], str) or not (doc["custom_code"] is None or isinstance(doc["custom_code"], str)):
            sys.exit(f"{path}:{n}: ref_code and custom_code must be strings")
        level, task = doc.get("level_id"), doc.get("task_id")
        name = f"line{n}" if level is None or task is None else f"level{level}/{task}"
        p = {"form": "jsonl", "line": n, "task": name, "candidate": f"{path}:{n}",
             "level_id": level, "task_id": task, "problem": None,
             "ref_src": doc["ref_code"], "cand_src": doc["custom_code"],
             "input": {k: v for k, v in doc.items() if k not in ("ref_code", "custom_code", "level_id", "task_id")}}
        missing = _task_parts_missing(doc["ref_code"])
        custom = (doc["custom_code"] or "").strip()
        if missing:
            p["problem"] = f"ref_code is not a KernelBench task: missing {missing}"
        elif not custom or custom == "None":
            p["problem"] = 'custom_code is empty, null or "None": no candidate to evaluate'
        pairs.append(p)
    return pairs


def identity(rec):
    if rec.get("form") == "jsonl" or "level_id" in rec:
        return ("jsonl", rec.get("line"), json.dumps(rec.get("level_id")), json.dumps(rec.get("task_id")))
    return ("tsv", rec.get("task"), rec.get("candidate"))


# -- one pair, in its own process ---------------------------------------------------------------

def _child(job_path, result_path):
    """Runs one job (a JSON file) and writes its result (a JSON file)."""
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    try:
        result = judge(job)
    except BaseException as e:  # recorded by the parent, not raised
        result = {"compiled": False, "correctness": False, "status": "error",
                  "error": f"harness: {type(e).__name__}: {e}", "metadata": {}}
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(result, f, default=str)


def _error_name(e):
    return f"{e.__class__.__module__}.{e.__class__.__name__}"


def judge(job):
    """eval_kernel_against_ref (measure_performance on) then measure_ref_program_time, on one device."""
    import numpy as np
    import torch

    dev = torch.device(job["device"])
    cuda = dev.type == "cuda"
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[job["precision"]]
    tol = TOLERANCE[job["precision"]]
    eval_mode = job["eval_mode"]

    def set_seed(seed):
        torch.manual_seed(seed)
        if cuda:
            torch.cuda.manual_seed(seed)

    def sync():
        if cuda:
            torch.cuda.synchronize(device=dev)

    def process(x):  # _process_input_tensor: every tensor cast to the precision, then moved
        if not isinstance(x, torch.Tensor):
            return x
        return x.to(dtype=dtype).to(device=dev)

    def clear_l2_cache():  # timing.clear_l2_cache
        dummy = torch.empty((32, 1024, 1024), dtype=torch.int64, device=dev)
        dummy.fill_(42)
        del dummy

    def time_calls(fn, args, num_warmup, num_trials, discard_first):
        """time_execution_with_cuda_event; on the CPU the same loop around perf_counter_ns."""
        times = []
        if cuda:
            with torch.cuda.device(dev):
                for _ in range(num_warmup):
                    fn(*args)
                    torch.cuda.synchronize(device=dev)
                torch.cuda.empty_cache()
                for trial in range(num_trials + discard_first):
                    torch.cuda.synchronize(device=dev)
                    start_event = torch.cuda.Event(enable_timing=True)
                    end_event = torch.cuda.Event(enable_timing=True)
                    clear_l2_cache()
                    start_event.record()
                    _ = fn(*args)
                    end_event.record()
                    torch.cuda.synchronize(device=dev)
                    ms = start_event.elapsed_time(end_event)
                    if trial >= discard_first:
                        times.append(ms)
            return times
        for _ in range(num_warmup):
            fn(*args)
        for trial in range(num_trials + discard_first):
            clear_l2_cache()
            t0 = time.perf_counter_ns()
            _ = fn(*args)
            t1 = time.perf_counter_ns()
            if trial >= discard_first:
                times.append((t1 - t0) / 1e6)
        return times

    def stats(times):  # get_timing_stats, with the mean before rounding kept beside it
        return {"mean": float(f"{np.mean(times):.3g}"), "std": float(f"{np.std(times):.3g}"),
                "min": float(f"{np.min(times):.3g}"), "max": float(f"{np.max(times):.3g}"),
                "num_trials": len(times), "mean_unrounded": float(np.mean(times))}

    def load_reference(context):  # load_original_model_and_inputs
        compile(job["ref_src"], "<string>", "exec")
        exec(job["ref_src"], context)
        return context.get("Model"), context.get("get_init_inputs"), context.get("get_inputs")

    if cuda:
        torch.cuda.set_device(dev)
    torch.set_printoptions(precision=4, threshold=10, edgeitems=3, linewidth=80)
    metadata = {"hardware": torch.cuda.get_device_name(dev) if cuda else _cpu_name(), "device": str(dev)}
    out = {"compiled": False, "correctness": False, "status": None, "error": None, "metadata": metadata,
           "hardware": metadata["hardware"]}
    tmp_module = None

    def finish(status, error=None):
        out["status"], out["error"] = status, error
        if tmp_module:
            try:
                os.remove(tmp_module)
            except OSError:
                pass
        return out

    try:
        # -- eval_kernel_against_ref ----------------------------------------------------------
        context = {}
        try:
            Model, get_init_inputs, get_inputs = load_reference(context)
            if Model is None or get_init_inputs is None or get_inputs is None:
                raise RuntimeError("Model, get_init_inputs or get_inputs not defined")
        except Exception as e:
            metadata["other_error"] = f"reference: {e}"
            return finish("error", f"reference did not load: {_error_name(e)}: {e}")
        set_seed(SEED)
        init_inputs = [process(x) for x in get_init_inputs()]
        with torch.no_grad():
            set_seed(SEED)
            original_model = Model(*init_inputs)
            if eval_mode:
                original_model.eval()

        os.environ["TORCH_USE_CUDA_DSA"] = "1"
        cand_src = job["cand_src"]
        backend = job["backend"]
        if backend == "auto":
            backend = "triton" if re.search(r"\btriton\b", cand_src) else "cuda"
        out["backend"] = backend
        try:
            if backend == "triton":  # load_custom_model_with_tempfile
                import importlib.util
                with tempfile.NamedTemporaryFile(mode="w", suffix=".py", delete=False) as f:
                    f.write(cand_src)
                    tmp_module = f.name
                spec = importlib.util.spec_from_file_location("temp_module", tmp_module)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                ModelNew = getattr(module, "ModelNew")
            else:  # load_custom_model: into the reference's dict
                if job.get("build_dir"):
                    cand_src = ("import os\n" f"os.environ['TORCH_EXTENSIONS_DIR'] = '{job['build_dir']}'\n") + cand_src
                    context["BUILD_DIRECTORY"] = job["build_dir"]
                try:
                    compile(cand_src, "<string>", "exec")
                    exec(cand_src, context)
                    ModelNew = context.get("ModelNew")
                except SyntaxError as e:
                    ModelNew = None
                    metadata["compilation_error"] = str(e)
            sync()
        except Exception as e:
            metadata["compilation_error_name"] = _error_name(e)
            metadata["compilation_error"] = str(e)
            if "lock" in str(e) or "No such file or directory" in str(e):
                # KernelBench returns None here (a build-lock clash it asks to retry)
                return finish("error", f"KernelBench would retry (lock or missing file): {_error_name(e)}: {e}")
            return finish("compile_error", f"{_error_name(e)}: {e}")
        if ModelNew is None:
            metadata.setdefault("compilation_error", "Syntax error in custom generated code or ModelNew not found")
            metadata["compilation_error_name"] = "SyntaxError"
            return finish("compile_error", metadata["compilation_error"])
        out["compiled"] = True

        try:
            with torch.no_grad():
                set_seed(SEED)
                custom_model = ModelNew(*init_inputs)
                assert hasattr(custom_model, "forward")
                if eval_mode:
                    custom_model.eval()
                original_model = original_model.to(device=dev, dtype=dtype)
                custom_model = custom_model.to(device=dev, dtype=dtype)
                sync()
        except RuntimeError as e:
            metadata["runtime_error"] = str(e)
            metadata["runtime_error_name"] = _error_name(e)
            return finish("runtime_error", f"building ModelNew: {_error_name(e)}: {e}")

        # run_and_check_correctness
        try:
            torch.manual_seed(SEED)
            trial_seeds = [torch.randint(0, 2 ** 32 - 1, (1,)).item() for _ in range(job["correct_trials"])]
            pass_count = 0
            failure = None
            with torch.no_grad():
                for trial, trial_seed in enumerate(trial_seeds):
                    set_seed(trial_seed)
                    inputs = [process(x) for x in get_inputs()]
                    set_seed(trial_seed)
                    model = original_model.to(device=dev, dtype=dtype)
                    set_seed(trial_seed)
                    model_new = custom_model.to(device=dev, dtype=dtype)
                    output = model(*inputs)
                    sync()
                    try:
                        output_new = model_new(*inputs)
                        sync()
                        if output.shape != output_new.shape:
                            metadata["correctness_issue"] = (
                                f"Output shape mismatch: Expected {output.shape}, got {output_new.shape}")
                            failure = ("incorrect", metadata["correctness_issue"])
                            break
                        if not torch.allclose(output, output_new, atol=tol, rtol=tol):
                            diff = torch.abs(output - output_new)
                            metadata.setdefault("max_difference", []).append(f"{torch.max(diff).item():.6f}")
                            metadata.setdefault("avg_difference", []).append(f"{torch.mean(diff).item():.6f}")
                            metadata["correctness_issue"] = "Output mismatch"
                        else:
                            pass_count += 1
                    except Exception as e:
                        msg = str(e)
                        metadata["runtime_error"] = msg[:197] + "..." if len(msg) > 200 else msg
                        metadata["runtime_error_name"] = _error_name(e)
                        failure = ("runtime_error", f"{_error_name(e)}: {metadata['runtime_error']}")
                        break
            if failure is None:
                metadata["correctness_trials"] = f"({pass_count} / {job['correct_trials']})"
                if pass_count != job["correct_trials"]:
                    failure = ("incorrect", f"Output mismatch: {metadata['correctness_trials']} trials passed, "
                                            f"max_difference {metadata.get('max_difference')} at atol=rtol={tol:g}")
        except Exception as e:  # the eval's catch around run_and_check_correctness
            metadata["runtime_error"] = str(e)
            metadata["runtime_error_name"] = _error_name(e)
            failure = ("runtime_error", f"{_error_name(e)}: {e}")
        if failure is not None:
            return finish(*failure)
        out["correctness"] = True

        # performance of the candidate (outside no_grad, as the eval measures it)
        try:
            sync()
            set_seed(SEED)
            inputs = [process(x) for x in get_inputs()]
            model_new = custom_model.to(device=dev, dtype=dtype)
            sync()
            cand = stats(time_calls(model_new, inputs, EVAL_WARMUP, job["trials"], DISCARD_FIRST))
            out["cand_stats"], out["cand_ms"], out["cand_std"] = cand, cand["mean"], cand["std"]
        except Exception as e:
            metadata["error_during_performance"] = f"{_error_name(e)}: {e}"
            return finish("ok", f"timing the candidate: {_error_name(e)}: {e}")

        # the eval's own reference timing (its excessive-speedup check)
        sync()
        set_seed(SEED)
        inputs = [process(x) for x in get_inputs()]
        sync()
        ev = stats(time_calls(original_model, inputs, EVAL_WARMUP, job["trials"], DISCARD_FIRST))
        out["eval_ref_stats"], out["eval_ref_ms"], out["eval_ref_std"] = ev, ev["mean"], ev["std"]
        out["speedup_eval"] = ev["mean"] / cand["mean"] if cand["mean"] > 0 else None
        out["excessive_speedup"] = bool(out["speedup_eval"] and out["speedup_eval"] > EXCESSIVE_SPEEDUP)
        del inputs, original_model, custom_model, model_new

        # -- measure_ref_program_time (run_and_check.py's reference time, eager) ---------------
        try:
            ctx = {}
            Model, get_init_inputs, get_inputs = load_reference(ctx)
            with torch.no_grad():
                sync()
                set_seed(SEED)
                inputs = get_inputs()
                set_seed(SEED)
                init_inputs = get_init_inputs()
                inputs = [x.to(device=dev, dtype=dtype) if isinstance(x, torch.Tensor) else x for x in inputs]
                init_inputs = [x.to(device=dev, dtype=dtype) if isinstance(x, torch.Tensor) else x
                               for x in init_inputs]
                model = Model(*init_inputs)
                if eval_mode:
                    model.eval()
                model = model.to(device=dev, dtype=dtype)
                sync()
                ref = stats(time_calls(model, inputs, REF_WARMUP, job["trials"], DISCARD_FIRST))
            out["ref_stats"], out["ref_ms"], out["ref_std"] = ref, ref["mean"], ref["std"]
            out["speedup"] = ref["mean"] / cand["mean"] if cand["mean"] > 0 else None
        except Exception as e:
            return finish("ok", f"timing the reference (measure_ref_program_time): {_error_name(e)}: {e}")
        return finish("ok")
    except Exception as e:
        # eval_from_generations.py's last-level catch: compiled false, correctness false
        key = "cuda_error" if "CUDA error" in str(e) else "other_error"
        metadata[key] = f"{_error_name(e)}: {e}"
        out["compiled"] = out["correctness"] = False
        return finish("runtime_error" if out.get("backend") else "error", f"{key}: {_error_name(e)}: {e}")


def _cpu_name():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def run_pair(p, args, workdir):
    """One pair in a fresh process; the record's verdict fields."""
    job = {"device": args.device, "precision": args.precision, "eval_mode": args.eval_mode,
           "backend": args.backend, "trials": args.trials, "correct_trials": args.correct_trials,
           "build_dir": args.build_dir, "ref_src": p["ref_src"], "cand_src": p["cand_src"]}
    job_path = os.path.join(workdir, "job.json")
    result_path = os.path.join(workdir, "result.json")
    log_path = os.path.join(workdir, "log.txt")
    with open(job_path, "w", encoding="utf-8") as f:
        json.dump(job, f)
    if os.path.exists(result_path):
        os.remove(result_path)
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen([sys.executable, os.path.realpath(__file__), "--child", job_path, result_path],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=args.timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group (its builds too)
            proc.wait()
            timed_out = True
    with open(log_path, encoding="utf-8", errors="replace") as f:
        tail = f.read()[-2000:]
    if timed_out:
        return {"compiled": None, "correctness": False, "status": "timeout",
                "error": f"no result within --timeout {args.timeout:g} s", "log_tail": tail}
    if not os.path.exists(result_path):
        sig = -proc.returncode if proc.returncode < 0 else None
        how = f"killed by signal {signal.Signals(sig).name}" if sig else f"exit code {proc.returncode}"
        # KernelBench's in-process harness would lose its worker here; recorded as a crash
        return {"compiled": None, "correctness": False, "status": "runtime_error",
                "error": f"the pair's process died ({how}) before a result", "log_tail": tail}
    with open(result_path, encoding="utf-8") as f:
        res = json.load(f)
    if res.get("status") != "ok" or res.get("error"):
        res["log_tail"] = tail
    return res


# -- the run ---------------------------------------------------------------------------------

def read_records(path):
    done = {}
    if not path or not os.path.exists(path):
        return done
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    good = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1 or all(not x.strip() for x in lines[i + 1:]):
                print(f"{path}: last line incomplete: dropped, its pair judged again", file=sys.stderr)
                with open(path, "w", encoding="utf-8") as f:
                    f.write("".join(x + "\n" for x in good))
                break
            sys.exit(f"{path}:{i + 1}: not a record")
        good.append(line)
        done[identity(rec)] = rec
    return done


def summary(records, total):
    by_status = {}
    for r in records:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    sp = [r["speedup"] for r in records if r.get("correctness") and r.get("speedup")]
    geo = None
    if sp:
        import math
        geo = math.exp(sum(math.log(x) for x in sp) / len(sp))
    fast = {str(p): sum(1 for r in records if r.get("correctness") and (r.get("speedup") or 0) > p) / total
            for p in (1.0, 1.2)} if total else {}
    return {"pairs": total, "recorded": len(records), "by_status": by_status,
            "correct": sum(1 for r in records if r.get("correctness")),
            "geomean_speedup": geo, "fast_p": fast}


def main(argv):
    if len(argv) == 3 and argv[0] == "--child":
        _child(argv[1], argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): "
                                        "timing precision on small kernels, KernelBench's\n"
                                        "timing (the kb-* steps of tools/bench/gpu_session.sh timing). Environment: each\n"
                                        "candidate's build goes to TORCH_EXTENSIONS_DIR under --build-dir.")
    ap.add_argument("--pairs", required=True, help="PAIRS.tsv (TASK<TAB>CANDIDATE) or CUDA-L1 .jsonl/.json")
    ap.add_argument("--format", choices=["tsv", "jsonl"], help="the --pairs file's format, where its extension does not say")
    ap.add_argument("--device", default="cuda:0", help="cuda:N or cpu (default cuda:0)")
    ap.add_argument("--out", help="records, one JSON object a line; pairs already there are skipped")
    ap.add_argument("--trials", type=int, default=100, help="timed calls per model, after the discarded first (100)")
    ap.add_argument("--correct-trials", type=int, default=5, help="correctness trials (5)")
    ap.add_argument("--precision", choices=sorted(TOLERANCE), default="fp32")
    ap.add_argument("--eval-mode", action="store_true", help="call .eval() on both models (CUDA-L1's variant)")
    ap.add_argument("--backend", choices=["auto", "cuda", "triton"], default="auto",
                    help="how the candidate is loaded: exec'd into the task's dict (cuda) or imported from a "
                         "temporary file (triton); auto: triton where the source mentions it")
    ap.add_argument("--build-dir", help="TORCH_EXTENSIONS_DIR for the candidates' builds, set as KernelBench's build_dir")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a pair may take (300, run_and_check.py's)")
    ap.add_argument("--json", action="store_true", help="the summary as one JSON object on stdout")
    args = ap.parse_args(argv)

    fmt = args.format or ("jsonl" if args.pairs.endswith((".jsonl", ".json")) else "tsv")
    pairs = load_jsonl(args.pairs) if fmt == "jsonl" else load_tsv(args.pairs)
    done = read_records(args.out)
    ids = {identity(p) for p in pairs}
    old = [r for k, r in done.items() if k in ids]
    if done and not old:
        sys.exit(f"{args.out}: its records are all of another set")
    todo = [(i, p) for i, p in enumerate(pairs, 1) if identity(p) not in done]
    print(f"kernelbench_timing: {len(pairs)} pairs, {len(pairs) - len(todo)} already recorded, on {args.device}",
          file=sys.stderr)
    records = list(old)
    t_run = time.time()
    with tempfile.TemporaryDirectory(prefix="kb_timing_") as workdir:
        for n, (index, p) in enumerate(todo, 1):
            rec = {"pair": index, "task": p["task"], "candidate": p["candidate"], "line": p["line"]}
            if p["form"] == "jsonl":
                rec["level_id"], rec["task_id"] = p["level_id"], p["task_id"]
            rec["form"] = p["form"]
            t0 = time.time()
            if p["problem"]:
                res = {"compiled": False, "correctness": False, "status": "error", "error": p["problem"]}
                rec["device"] = None
            else:
                res = run_pair(p, args, workdir)
                rec["device"] = args.device
            rec.update(res)
            rec.update({"wall_s": round(time.time() - t0, 3), "trials": args.trials,
                        "correct_trials": args.correct_trials, "eval_mode": args.eval_mode,
                        "precision": args.precision, "kernelbench_commit": KERNELBENCH_COMMIT})
            if p["form"] == "jsonl":
                rec["input"] = p["input"]
            records.append(rec)
            if args.out:
                with open(args.out, "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec, default=str) + "\n")
            sp = f" {rec['speedup']:.3f}x" if rec.get("speedup") else ""
            err = f" ({rec['error'][:120]})" if rec.get("error") else ""
            print(f"[{n}/{len(todo)}] {rec['task']}: {os.path.basename(str(rec['candidate']))}: "
                  f"{rec['status']}{sp}{err} {rec['wall_s']:.1f}s", file=sys.stderr)
    s = summary(records, len(pairs))
    s["wall_s"] = round(time.time() - t_run, 3)
    s["out"] = args.out
    if args.json:
        print(json.dumps(s))
    else:
        print(f"pairs     {s['pairs']} ({len(todo)} judged now, {len(old)} from --out)")
        print(f"status    " + ", ".join(f"{k} {v}" for k, v in sorted(s["by_status"].items())))
        print(f"correct   {s['correct']}")
        if s["geomean_speedup"]:
            print(f"speedup   geomean {s['geomean_speedup']:.3f}x over the correct pairs")
        print("fast_p    " + ", ".join(f"fast_{k} {v:.3f}" for k, v in s["fast_p"].items()))
        print(f"wall      {s['wall_s']:.1f} s")
    return 0 if s["recorded"] == s["pairs"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
