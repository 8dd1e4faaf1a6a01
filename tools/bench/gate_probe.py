#!/usr/bin/env python3
"""The gate before a timed sample (env/eval/harness/harness_kernels.cu, crucible_gate; the worker's
_HarnessKernels.gate_close / gate_open) on a GPU, checked and measured in under a minute:

  held      a kernel queued on a side stream while the gate is closed has not run 5 ms later,
            and has once the gate is opened (the gate fills every SM, so no stream runs ahead);
  timeout   a gate never opened gives up after its max_cycles and says so (gate_timed_out);
  pace      CALLS back-to-back calls of a small elementwise op (a 64x64 add, a few us on the
            device) timed between two events on the stream, without the gate (the host launches
            them as the device runs them: the host's pace) and behind it (queued first: the
            device's pace), REPEAT times each, with a busy host thread or without (--busy).

Usage: python3 tools/bench/gate_probe.py --kernels build-gpu/env/harness_kernels.fatbin [--json]
Prints one JSON object (--json) or a short table."""
import argparse
import importlib.util
import json
import os
import statistics
import sys
import threading
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def load_worker():
    spec = importlib.util.spec_from_file_location("crucible_worker", os.path.join(ROOT, "env", "eval", "harness", "worker.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def timed(calls, fn, gate=None, cycles=40_000_000):
    s = torch.cuda.current_stream()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    if gate is not None:
        gate.gate_close(cycles)
    e0.record(s)
    try:
        for _ in range(calls):
            fn()
        e1.record(s)
    finally:
        if gate is not None:
            gate.gate_open()
    e1.synchronize()
    return e0.elapsed_time(e1) * 1e3 / calls  # us per call


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): "
                                        "timing precision on small kernels, the gate\n"
                                        "(tools/bench/gpu_session.sh timing start runs it first). No environment variables.")
    ap.add_argument("--kernels", required=True, help="the harness kernels' fatbin")
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--busy", action="store_true", help="a host thread spinning beside the launches")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    w = load_worker()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    with open(args.kernels, "rb") as f:
        k = w._HarnessKernels(f.read())
    out = {"device": torch.cuda.get_device_name(), "gate_blocks": k._gate_blocks}

    # held: a side stream's kernel does not run while the gate is closed
    side = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device="cuda")
    # The side kernel once before: under CUDA's lazy module loading (torch's default) the first
    # launch of a kernel loads its module, which waits for the device, so behind a closed gate it
    # would wait for the gate's timeout (measured on an H100, 2026-11-25). Every kernel a timed
    # sample launches ran before in the worker's untimed calls.
    with torch.cuda.stream(side):
        x.add_(1.0)
        x.zero_()
    torch.cuda.synchronize()
    k.gate_close(400_000_000)  # about 200 ms at 2 GHz: opened long before
    ev = torch.cuda.Event()
    with torch.cuda.stream(side):
        x.add_(1.0)
        ev.record(side)
    time.sleep(0.005)
    ran_while_closed = ev.query()
    k.gate_open()
    torch.cuda.synchronize()
    out["held"] = {"side_stream_ran_while_closed": ran_while_closed, "ran_after_open": ev.query(),
                   "value": float(x[0].item()), "timed_out": k.gate_timed_out()}

    # timeout: a gate never opened gives up
    t0 = time.perf_counter()
    k.gate_close(2_000_000)  # about 1 ms
    torch.cuda.synchronize()
    out["timeout"] = {"waited_ms": (time.perf_counter() - t0) * 1e3, "timed_out": k.gate_timed_out()}
    k.gate_open()

    # pace: host-paced against device-paced samples of a small op
    a = torch.randn(64, 64, device="cuda")
    b = torch.randn(64, 64, device="cuda")
    stop = threading.Event()
    busy = None
    if args.busy:
        def spin():
            while not stop.is_set():
                sum(i * i for i in range(1000))
        busy = threading.Thread(target=spin, daemon=True)
        busy.start()
    fn = lambda: torch.add(a, b)  # noqa: E731
    for _ in range(5):
        timed(args.calls, fn)
        timed(args.calls, fn, k)
    free = [timed(args.calls, fn) for _ in range(args.repeat)]
    gated = [timed(args.calls, fn, k) for _ in range(args.repeat)]
    stop.set()
    out["pace"] = {"calls": args.calls, "busy_host": args.busy,
                   "ungated_us": {"median": statistics.median(free), "min": min(free), "max": max(free)},
                   "gated_us": {"median": statistics.median(gated), "min": min(gated), "max": max(gated)},
                   "gate_timeouts": k.gate_timed_out()}
    ok = (not out["held"]["side_stream_ran_while_closed"] and out["held"]["ran_after_open"]
          and out["held"]["value"] == 1.0 and out["timeout"]["timed_out"])
    out["ok"] = ok
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
