#!/usr/bin/env python3
"""What the first launch of each of the harness's own device operations costs in a fresh process.

torch's kernels load lazily (CUDA_MODULE_LOADING=LAZY): the first launch of a kernel in a process
loads it, and every evaluator worker is a new process. For each torch operation the worker
used, or still uses, for its own device work (input scaling and copies, poisoning, the cache
flush and spin, the round output check, the input-unchanged check), this probe times its first
and its second call, each
followed by a synchronisation, in fresh processes with the device already initialised. It also
loads the harness's own kernels (env/harness/harness_kernels.cu, compiled with nvcc as the build
does, or --fatbin) with cuModuleLoadData and times that and the first and second launch of its
round check.

  python3 tools/bench/lazy_load_probe.py --processes 3
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_fatbin(path):
    """The harness kernels' fatbin as the build makes it by default (80-real, 90-real, 90-virtual)."""
    src = os.path.join(ROOT, "env", "harness", "harness_kernels.cu")
    subprocess.run(["nvcc", "-fatbin", "-std=c++17", "-gencode", "arch=compute_80,code=sm_80", "-gencode",
                    "arch=compute_90,code=sm_90", "-gencode", "arch=compute_90,code=compute_90", "-o", path, src],
                   check=True)


def child(fatbin):
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    dev = "cuda"
    x = torch.randn(16384, 4096, device=dev)
    y = x.clone()
    torch.cuda.synchronize()
    gen = torch.Generator(device=dev).manual_seed(1)
    flush = torch.ones(64 << 20, dtype=torch.int32, device=dev)
    fsum = torch.empty((), dtype=torch.int64, device=dev)
    idx_holder = {}

    def placed():
        buf = torch.empty(x.numel() * 4 + 4096, dtype=torch.uint8, device=dev)
        z = torch.empty(0, dtype=x.dtype, device=dev)
        z.set_(buf.untyped_storage(), 1024, x.size(), x.stride())
        z.copy_(x)

    def sample():
        idx_holder["i"] = torch.randint(0, x.numel(), (1 << 16,), generator=gen, device=dev)

    def gather():
        i = idx_holder["i"]
        idx_holder["xs"] = torch.index_select(x.reshape(-1), 0, i)
        idx_holder["ys"] = torch.index_select(y.reshape(-1), 0, i)

    def isclose():
        idx_holder["ok"] = torch.isclose(idx_holder["ys"], idx_holder["xs"], rtol=1e-2, atol=1e-3, equal_nan=True)

    ops = [
        ("uniform_ float32", lambda: torch.empty(x.shape, device=dev).uniform_(0.5, 2.0, generator=gen)),
        ("mul float32", lambda: x.mul(y)),
        ("clone float32", lambda: x.clone()),
        ("placed copy (set_ + copy_)", placed),
        ("fill_ uint8 255", lambda: torch.empty(1 << 20, dtype=torch.uint8, device=dev).fill_(255)),
        ("equal on uint8 views", lambda: torch.equal(x.view(torch.uint8), y.view(torch.uint8))),
        ("flush: sum int32 -> int64", lambda: torch.sum(flush, 0, dtype=torch.int64, out=fsum)),
        ("spin: _cuda_sleep", lambda: torch._C._cuda_sleep(200_000)),
        ("sample: randint", sample),
        ("gather: index_select x2", gather),
        ("isclose", isclose),
        ("count_nonzero", lambda: torch.count_nonzero(idx_holder["ok"])),
        ("stack int64", lambda: torch.stack([fsum, fsum])),
        ("scale: float64 abs nan_to_num mean", lambda: idx_holder["xs"].to(torch.float64).abs().nan_to_num(0.0, 0.0, 0.0).mean()),
    ]
    out = {}
    for name, fn in ops:
        times = []
        for _ in range(2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        out[name] = times
    if fatbin:
        lib = ctypes.CDLL("libcuda.so.1")
        data = open(fatbin, "rb").read()
        mod = ctypes.c_void_p()
        fn = ctypes.c_void_p()
        t0 = time.perf_counter()
        rc = lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(data))
        rc2 = lib.cuModuleGetFunction(ctypes.byref(fn), mod, b"crucible_round_check_f32")
        load_ms = (time.perf_counter() - t0) * 1e3
        if rc or rc2:
            out["harness kernels: load error"] = [rc, rc2]
        else:
            bad = torch.zeros((), dtype=torch.int64, device=dev)
            vals = [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_int64(x.numel()),
                    ctypes.c_uint64(12345), ctypes.c_int64(1 << 16), ctypes.c_double(1e-3), ctypes.c_double(1e-2),
                    ctypes.c_void_p(bad.data_ptr())]
            params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            times = []
            for _ in range(2):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                rc = lib.cuLaunchKernel(fn, 256, 1, 1, 256, 1, 1, 0, stream, params, None)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) * 1e3)
            out["harness kernels: cuModuleLoadData + GetFunction"] = [load_ms, 0.0]
            out["harness kernels: round check launch (rc %d, mismatches %d)" % (rc, int(bad.item()))] = times
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--fatbin", default="", help="the build's harness_kernels.fatbin (default: compile it with nvcc)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.child is not None:
        child(args.child)
        return 0
    fatbin = ""
    if args.fatbin:
        fatbin = args.fatbin
    else:
        try:
            fatbin = os.path.join(tempfile.mkdtemp(), "harness_kernels.fatbin")
            build_fatbin(fatbin)
        except (OSError, subprocess.CalledProcessError) as e:
            fatbin = ""
            print(f"no harness kernels: {e}", file=sys.stderr)
    runs = []
    for _ in range(args.processes):
        res = subprocess.run([sys.executable, __file__, "--child", fatbin], check=True, capture_output=True, text=True)
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    names = list(runs[0])
    total_first = 0.0
    print(f"{'operation':48s} {'first call ms (per process)':>34s} {'second':>8s}")
    for n in names:
        firsts = [r[n][0] for r in runs if n in r]
        seconds = [r[n][1] for r in runs if n in r]
        if not n.startswith("harness kernels"):
            total_first += statistics.median(firsts) - statistics.median(seconds)
        print(f"{n:48s} {' '.join(f'{v:7.2f}' for v in firsts):>34s} {statistics.median(seconds):8.3f}")
    print(f"torch operations, first minus second call, sum of medians: {total_first:.1f} ms")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
