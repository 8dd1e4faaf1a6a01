#!/usr/bin/env python3
"""What a full cyclic garbage collection costs in an evaluator worker's process.

Imports the worker harness (env/harness/worker.py: torch, zmq, the static checks), then times
full collections (gc.collect()) before and after gc.freeze(), which is what evaluator.quiet_gc
does when a job arrives: frozen objects are no longer scanned.

  python3 tools/bench/gc_probe.py [--repeat 3]
"""
import argparse
import gc
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "env", "harness"))
    import worker  # noqa: F401  (the harness's imports are the point)
    print(f"python {sys.version.split()[0]}, objects tracked by the collector: {len(gc.get_objects())}")
    for label in ("before gc.freeze()", "after gc.freeze()"):
        if label.startswith("after"):
            gc.freeze()
        ms = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            gc.collect()
            ms.append((time.perf_counter() - t0) * 1e3)
        print(f"full collection {label}: " + ", ".join(f"{m:.1f}" for m in ms) + " ms")


if __name__ == "__main__":
    main()
