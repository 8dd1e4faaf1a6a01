#!/usr/bin/env python3
"""Where a candidate's module import and first forward call go in a fresh process, under cProfile.

An evaluator worker (env/harness/worker.py) calls the candidate for the first time in its
correctness trials, with the device already initialised and torch's compiler stack imported
(the zygote imports torch._dynamo, which brings in Triton). A Triton candidate's first call
then loads its kernel and launcher, which took ~0.6 s of a 1.4-1.75 s verdict on an H100; a
load_inline candidate's import, from the extension cache, took 0.3-0.5 s. This probe repeats
those steps in fresh processes and prints the import's and the first call's times, the second
call's, and the heaviest functions of the import and the first call by cumulative time.

  python3 tools/bench/first_call_probe.py --task tools/bench/eval_gpu/tasks/gelu_tanh_affine.py \
      --candidate tools/bench/eval_gpu/candidates/gelu_tanh_affine.py --processes 3
"""
import argparse
import json
import statistics
import subprocess
import sys


def child(task_path, cand_path, top):
    import cProfile
    import io
    import pstats
    import time

    import torch
    import torch._dynamo  # noqa: F401  (as the worker's zygote does)

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from eval_gpu_suite import load_module

    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    task = load_module(task_path, "probe_task")
    imp = cProfile.Profile()
    t0 = time.perf_counter()
    imp.enable()
    cand = load_module(cand_path, "probe_cand")  # a load_inline extension loads from its cache here
    imp.disable()
    import_s = time.perf_counter() - t0
    torch.manual_seed(1)
    model = cand.ModelNew(*task.get_init_inputs()).cuda()
    inputs = [x.cuda() if hasattr(x, "cuda") else x for x in task.get_inputs()]
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    with torch.no_grad():
        out = model(*inputs)
    torch.cuda.synchronize()
    prof.disable()
    first = time.perf_counter() - t0
    del out
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model(*inputs)
    torch.cuda.synchronize()
    second = time.perf_counter() - t0
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(top)
    imp_text = io.StringIO()
    pstats.Stats(imp, stream=imp_text).sort_stats("cumulative").print_stats(top)
    print(json.dumps({"import_s": import_s, "first_s": first, "second_s": second, "profile": text.getvalue(),
                      "import_profile": imp_text.getvalue()}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", required=True)
    ap.add_argument("--candidate", required=True)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.task, args.candidate, args.top)
        return 0
    runs = []
    for _ in range(args.processes):
        out = subprocess.run([sys.executable, __file__, "--child", "--task", args.task, "--candidate", args.candidate,
                              "--top", str(args.top)], check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    imports = [r["import_s"] for r in runs]
    print(f"candidate module import: median {statistics.median(imports) * 1e3:.1f} ms "
          f"({', '.join(f'{x * 1e3:.1f}' for x in imports)})")
    print("import of the last process, by cumulative time:")
    print(runs[-1]["import_profile"])
    firsts = [r["first_s"] for r in runs]
    seconds = [r["second_s"] for r in runs]
    print(f"first call: median {statistics.median(firsts) * 1e3:.1f} ms ({', '.join(f'{x * 1e3:.1f}' for x in firsts)}); "
          f"second call: median {statistics.median(seconds) * 1e3:.2f} ms")
    print("first call of the last process, by cumulative time:")
    print(runs[-1]["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
