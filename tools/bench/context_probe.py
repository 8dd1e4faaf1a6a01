#!/usr/bin/env python3
"""What a fresh process pays for its CUDA context, under the driver settings a worker could use.

Every evaluator worker runs one candidate and exits, so every verdict pays for a new CUDA
context (docs/PERFORMANCE.md: about 0.26 s on an H100, serialised by the driver). This probe
times the driver's own steps in fresh processes through libcuda (no torch): cuInit, retaining
the device's primary context (what the runtime does), making it current, and a first 1 MiB
allocation, under each environment variant below, one process at a time and then N at once.

  python3 tools/bench/context_probe.py --processes 5 --together 4

--torch times a worker's own steps instead (torch imported before the clock starts, as in a forked
worker: torch.cuda.init(), then the first allocation and synchronisation, which create the
context; with --fork they are forked from the probe's own process, which imported torch without
touching the device, as the evaluator's zygote forks workers); --busy repeats every measurement
while a helper process keeps the device busy with back-to-back kernels and a synchronisation
after each (as a timing's warm-up rounds do), and prints the helper's kernel time beside each; --variants picks variants by name. Each "at once"
line also gives the wall from the first process's cuInit to the last one's end, over N: what one
context costs when N are made together.

  python3 tools/bench/context_probe.py --torch --busy --variants max_connections_2 --together 3,6
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = {
    "default": {},
    "max_connections_1": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
    "max_connections_2": {"CUDA_DEVICE_MAX_CONNECTIONS": "2"},
    "max_connections_4": {"CUDA_DEVICE_MAX_CONNECTIONS": "4"},
    "module_loading_lazy": {"CUDA_MODULE_LOADING": "LAZY"},
    "visible_0": {"CUDA_VISIBLE_DEVICES": "0"},
    "all_three": {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "CUDA_MODULE_LOADING": "LAZY", "CUDA_VISIBLE_DEVICES": "0"},
    # The command buffers each hardware queue gets (CUDA 13): smaller ones, less to allocate and map.
    "queues_2_scale_0.25x": {"CUDA_DEVICE_MAX_CONNECTIONS": "2", "CUDA_SCALE_LAUNCH_QUEUES": "0.25x"},
    "queues_2_scale_0.5x": {"CUDA_DEVICE_MAX_CONNECTIONS": "2", "CUDA_SCALE_LAUNCH_QUEUES": "0.5x"},
    "queues_2_scale_4x": {"CUDA_DEVICE_MAX_CONNECTIONS": "2", "CUDA_SCALE_LAUNCH_QUEUES": "4x"},
}


class Laps(dict):
    """Each step's seconds since the one before (perf_counter), by name; "t0" the start on the
    host's monotonic clock, which all processes share."""

    def __init__(self):
        super().__init__(t0=time.monotonic())
        self._t = time.perf_counter()

    def step(self, name):
        now = time.perf_counter()
        self[name] = now - self._t
        self._t = now


def child():
    if "--torch" in sys.argv:
        return torch_child()
    cuda = ctypes.CDLL("libcuda.so.1")
    out = Laps()

    def step(name, rc):
        if rc != 0:
            raise SystemExit(f"{name} failed: CUresult {rc}")
        out.step(name)

    step("cuInit", cuda.cuInit(0))
    dev = ctypes.c_int()
    step("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0))
    ctx = ctypes.c_void_p()
    step("primary_ctx_retain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    step("ctx_set_current", cuda.cuCtxSetCurrent(ctx))
    ptr = ctypes.c_uint64()
    step("first_alloc", cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)))
    step("ctx_synchronize", cuda.cuCtxSynchronize())
    out["t1"] = time.monotonic()
    print(json.dumps(out))


def torch_child():
    import torch

    # Processes started together import torch at different speeds: each says it has, and all
    # begin when the parent says so, so that their device steps start together.
    print("imported", flush=True)
    sys.stdin.readline()
    print(json.dumps(torch_steps(torch)))


def torch_steps(torch):
    """A worker's device steps through torch; returns their Laps."""
    out = Laps()
    step = out.step
    torch.cuda.init()
    step("torch_cuda_init")
    torch.empty(1, device="cuda")
    step("first_alloc")
    torch.cuda.synchronize()
    step("synchronize")
    if "--profiler" in sys.argv:
        # The worker's third held step: the profiler's first use (CUPTI), on one small kernel.
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts):
                torch.empty(1, device="cuda").fill_(1)
                torch.cuda.synchronize()
        step("profiler_first_use")
    out["t1"] = time.monotonic()
    return out


def run_forked(env_extra, together):
    """--fork: children forked from this process, which imported torch without touching the
    device (as the evaluator's zygote does), each through torch_steps once all exist."""
    import torch

    kids = []
    for _ in range(together):
        go_r, go_w = os.pipe()
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(go_w)
                os.close(out_r)
                os.environ.update(env_extra)
                os.read(go_r, 1)
                os.write(out_w, json.dumps(torch_steps(torch)).encode())
                code = 0
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(go_r)
        os.close(out_w)
        kids.append((pid, go_w, out_r))
    for _, go_w, _ in kids:
        os.write(go_w, b"g")
        os.close(go_w)
    res = []
    for pid, _, out_r in kids:
        with os.fdopen(out_r, "rb") as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        if status != 0 or not data:
            raise SystemExit(f"forked child failed (status {status})")
        res.append(json.loads(data))
    return res


BUSY = r"""
import sys, time, torch
x = torch.randn(16384, 4096, device="cuda")
w = torch.ones(4096, device="cuda")
for _ in range(20):
    torch.nn.functional.layer_norm(x, (4096,), w)
torch.cuda.synchronize()
print("ready", flush=True)
times = []
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
while True:
    a.record()
    torch.nn.functional.layer_norm(x, (4096,), w)
    b.record()
    torch.cuda.synchronize()
    times.append(a.elapsed_time(b))
    if len(times) % 50 == 0:
        print(" ".join(f"{v:.4f}" for v in times), flush=True)
        times = []
"""


class Busy:
    """A helper process that keeps the device busy until stopped; reports its kernel times."""

    def __enter__(self):
        self.p = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
        if self.p.stdout.readline().strip() != "ready":
            raise SystemExit("the busy helper did not start")
        return self

    def __exit__(self, *exc):
        self.p.kill()
        rest = self.p.stdout.read()
        self.p.wait()
        self.times = [float(v) for line in rest.splitlines() for v in line.split()]


def run(env_extra, together):
    if "--fork" in sys.argv:
        return run_forked(env_extra, together)
    env = dict(os.environ, **env_extra)
    use_torch = "--torch" in sys.argv
    cmd = [sys.executable, __file__, "--child"] + (["--torch"] if use_torch else []) + (
        ["--profiler"] if "--profiler" in sys.argv else [])
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
             for _ in range(together)]
    if use_torch:
        for p in procs:
            if p.stdout.readline().strip() != "imported":
                raise SystemExit("a child did not import torch")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
    res = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"child failed ({p.returncode})")
        res.append(json.loads(out.strip().splitlines()[-1]))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=5, help="fresh processes per variant, one at a time")
    ap.add_argument("--together", default="4", help="then this many started at once (a comma-separated list)")
    ap.add_argument("--variants", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--torch", action="store_true", help="time a worker's torch steps instead of libcuda's")
    ap.add_argument("--busy", action="store_true", help="measure again beside a process keeping the device busy")
    ap.add_argument("--fork", action="store_true",
                    help="with --torch: fork the children from this process (torch imported, no device), as the zygote does")
    ap.add_argument("--profiler", action="store_true",
                    help="with --torch: also time the profiler's first use (CUPTI), the worker's third held step")
    ap.add_argument("--out", default="")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child()
        return 0
    results = {}
    together = [int(n) for n in args.together.split(",") if n.strip()]
    names = [n for n in args.variants.split(",") if n] or list(VARIANTS)
    for name in names:
        if name not in VARIANTS:
            raise SystemExit(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")
    steps = lambda r: {k: v for k, v in r.items() if k not in ("t0", "t1")}
    for busy in ([False, True] if args.busy else [False]):
        for name in names:
            extra = VARIANTS[name]
            label = name + (" (busy)" if busy else "")
            helper = Busy() if busy else None
            if helper:
                helper.__enter__()
            alone = [r for _ in range(args.processes) for r in run(extra, 1)]
            sides = {n: run(extra, n) for n in together if n > 1}
            if helper:
                helper.__exit__(None, None, None)
            results[label] = {"alone": alone, "together": sides}
            keys = list(steps(alone[0]))
            med = {k: statistics.median(r[k] for r in alone) * 1e3 for k in keys}
            total_alone = statistics.median(sum(steps(r).values()) for r in alone) * 1e3
            line = ", ".join(f"{k} {v:.1f}" for k, v in med.items())
            print(f"{label:27s} alone (median of {len(alone)}): total {total_alone:.1f} ms; {line}")
            for n, side in sides.items():
                totals = sorted(sum(steps(r).values()) * 1e3 for r in side)
                wall = (max(r["t1"] for r in side) - min(r["t0"] for r in side)) * 1e3
                print(f"{'':27s} {n} at once: totals {', '.join(f'{x:.0f}' for x in totals)} ms; "
                      f"first start to last end {wall:.0f} ms, {wall / n:.0f} ms a context")
            if helper and helper.times:
                ts = sorted(helper.times)
                print(f"{'':27s} helper's kernel: median {statistics.median(ts):.4f} ms, "
                      f"p99 {ts[int(0.99 * (len(ts) - 1))]:.4f} ms over {len(ts)} calls")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
