#!/usr/bin/env python3
"""What a fresh process pays for its CUDA context, under the driver settings a worker could use.

Every evaluator worker runs one candidate and exits, so every verdict pays for a new CUDA
context (docs/PERFORMANCE.md: about 0.26 s on an H100, serialised by the driver). This probe
times the driver's own steps in fresh processes through libcuda (no torch): cuInit, retaining
the device's primary context (what the runtime does), making it current, and a first 1 MiB
allocation, under each environment variant below, one process at a time and then N at once.

  python3 tools/bench/context_probe.py --processes 5 --together 4
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
}


def child():
    cuda = ctypes.CDLL("libcuda.so.1")
    out = {}
    t = time.perf_counter()

    def step(name, rc):
        nonlocal t
        if rc != 0:
            raise SystemExit(f"{name} failed: CUresult {rc}")
        now = time.perf_counter()
        out[name] = now - t
        t = now

    step("cuInit", cuda.cuInit(0))
    dev = ctypes.c_int()
    step("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0))
    ctx = ctypes.c_void_p()
    step("primary_ctx_retain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    step("ctx_set_current", cuda.cuCtxSetCurrent(ctx))
    ptr = ctypes.c_uint64()
    step("first_alloc", cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)))
    step("ctx_synchronize", cuda.cuCtxSynchronize())
    print(json.dumps(out))


def run(env_extra, together):
    env = dict(os.environ, **env_extra)
    procs = [subprocess.Popen([sys.executable, __file__, "--child"], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(together)]
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
    ap.add_argument("--together", type=int, default=4, help="then this many started at once")
    ap.add_argument("--out", default="")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child()
        return 0
    results = {}
    for name, extra in VARIANTS.items():
        alone = [r for _ in range(args.processes) for r in run(extra, 1)]
        side = run(extra, args.together) if args.together > 1 else []
        results[name] = {"alone": alone, "together": side}
        keys = list(alone[0])
        med = {k: statistics.median(r[k] for r in alone) * 1e3 for k in keys}
        total_alone = statistics.median(sum(r.values()) for r in alone) * 1e3
        line = ", ".join(f"{k} {v:.1f}" for k, v in med.items())
        print(f"{name:20s} alone (median of {len(alone)}): total {total_alone:.1f} ms; {line}")
        if side:
            totals = sorted(sum(r.values()) * 1e3 for r in side)
            print(f"{'':20s} {len(side)} at once: totals {', '.join(f'{x:.0f}' for x in totals)} ms")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
