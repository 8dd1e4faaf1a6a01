#!/usr/bin/env python3
"""Which CUDA calls of one process wait while other processes create their CUDA contexts.

Under concurrency the evaluator's own device calls (mapping a worker's exported outputs, copying
them) took 80-90 ms each while starting workers created their contexts, against 1-7 ms with one
context at a time (docs/PERFORMANCE.md). This probe times single calls in one process, first
quiet, then while `--storm` helper processes keep creating contexts (each a fresh process:
cuInit, primary context, a 1 MiB allocation, exit; as evaluator workers do, with
CUDA_DEVICE_MAX_CONNECTIONS=2), then quiet again:

  kernel   a small kernel launch and synchronize
  event    an event recorded and waited for
  copy     a 16 MiB device-to-device copy and synchronize
  alloc    a 64 MiB cudaMalloc (the caching allocator emptied first) and synchronize
  free     torch.cuda.empty_cache() of that 64 MiB block
  ipc      cuIpcOpenMemHandle + cuIpcCloseMemHandle of 64 MiB another process exported

  python3 tools/bench/driver_contention.py --storm 6 --calls 40 --out probe.json
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

EXPORTER = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev = ctypes.c_int(); assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx = ctypes.c_void_p(); assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
ptr = ctypes.c_uint64(); assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64 << 20)) == 0
h = ctypes.create_string_buffer(64); assert cuda.cuIpcGetMemHandle(h, ptr) == 0
print(h.raw.hex(), flush=True)
sys.stdin.read()
"""


def storm(n, stop, counter):
    env = dict(os.environ, CUDA_DEVICE_MAX_CONNECTIONS="2")
    child = [sys.executable, os.path.join(HERE, "context_probe.py"), "--child"]
    procs = []
    while not stop.is_set():
        while len(procs) < n:
            procs.append(subprocess.Popen(child, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for p in list(procs):
            if p.poll() is not None:
                procs.remove(p)
                counter[0] += 1
        time.sleep(0.002)
    for p in procs:
        p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--storm", type=int, default=6, help="helper processes creating contexts at once")
    ap.add_argument("--calls", type=int, default=40, help="calls of each kind per phase")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    import torch

    torch.cuda.init()
    dev = torch.device("cuda:0")
    cuda = ctypes.CDLL("libcuda.so.1")
    exporter = subprocess.Popen([sys.executable, "-c", EXPORTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
    handle = bytes.fromhex(exporter.stdout.readline().strip())

    class Handle(ctypes.Structure):
        _fields_ = [("reserved", ctypes.c_char * 64)]

    h = Handle()
    ctypes.memmove(ctypes.byref(h), handle, 64)
    small = torch.ones(1024, device=dev)
    src = torch.empty(16 << 20, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)

    def kernel():
        small.add_(1)
        torch.cuda.synchronize()

    def event():
        e = torch.cuda.Event()
        e.record()
        e.synchronize()

    def copy():
        dst.copy_(src)
        torch.cuda.synchronize()

    held = []

    def alloc():
        torch.cuda.empty_cache()
        held.append(torch.empty(64 << 20, dtype=torch.uint8, device=dev))
        torch.cuda.synchronize()

    def free():
        held.clear()
        torch.cuda.empty_cache()

    def ipc():
        p = ctypes.c_uint64()
        rc = cuda.cuIpcOpenMemHandle_v2(ctypes.byref(p), h, ctypes.c_uint(1))
        if rc != 0:
            raise SystemExit(f"cuIpcOpenMemHandle failed: CUresult {rc}")
        cuda.cuIpcCloseMemHandle(p)

    ops = {"kernel": kernel, "event": event, "copy": copy, "alloc": alloc, "free": free, "ipc": ipc}
    for f in ops.values():  # first calls out of the way
        f()
        f()

    def phase():
        times = {k: [] for k in ops}
        for _ in range(args.calls):
            for k, f in ops.items():
                t = time.perf_counter()
                f()
                times[k].append((time.perf_counter() - t) * 1e3)
        return {k: {"median_ms": statistics.median(v), "p90_ms": sorted(v)[int(0.9 * (len(v) - 1))],
                    "max_ms": max(v)} for k, v in times.items()}

    result = {"storm": args.storm, "calls": args.calls, "phases": {}}
    result["phases"]["quiet"] = phase()
    stop = threading.Event()
    made = [0]
    th = threading.Thread(target=storm, args=(args.storm, stop, made))
    th.start()
    time.sleep(1.0)  # the storm under way
    t0 = time.perf_counter()
    result["phases"]["storm"] = phase()
    storm_s = time.perf_counter() - t0
    stop.set()
    th.join()
    result["contexts_per_s"] = made[0] / max(storm_s + 1.0, 1e-9)
    result["phases"]["quiet_after"] = phase()
    exporter.stdin.close()
    exporter.wait()
    print(f"storm of {args.storm} processes creating contexts: {result['contexts_per_s']:.1f} contexts/s")
    print(f"{'call':8s} " + " ".join(f"{p:>24s}" for p in result["phases"]))
    for k in ops:
        cells = []
        for p in result["phases"]:
            r = result["phases"][p][k]
            cells.append(f"{r['median_ms']:7.2f} / {r['p90_ms']:7.2f} / {r['max_ms']:6.1f}")
        print(f"{k:8s} " + " ".join(f"{c:>24s}" for c in cells))
    print("(median / p90 / max ms)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
