#!/usr/bin/env python3
"""tools/bench/confine_cost.py [N]: what entering the workers' sandbox (env/eval/harness/confine.py)
costs. A process with torch imported (the size of a worker or zygote) forks N times, as the
zygote does; each child enters the worker's sandbox. Prints the fork's and the confinement's
milliseconds (the keeper's fork included in the latter), sorted, and their medians, as JSON."""
import argparse
import importlib.util
import json
import os
import statistics
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse():
    ap = argparse.ArgumentParser(description=__doc__,
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): a verdict's wall time with "
                                        "the workers' sandbox, what entering it costs. Needs torch. No environment "
                                        "variables.")
    ap.add_argument("n", type=int, nargs="?", default=10, help="forks (10)")
    return ap.parse_args()


ARGS = parse() if __name__ == "__main__" else None
spec = importlib.util.spec_from_file_location("confine", os.path.join(HERE, "..", "..", "env", "eval", "harness", "confine.py"))
confine = importlib.util.module_from_spec(spec)
spec.loader.exec_module(confine)
import torch  # noqa: E402,F401  (the size of a worker)


def main():
    n = ARGS.n
    forks, confines, layers = [], [], None
    for _ in range(n):
        r, w = os.pipe()
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            t1 = time.perf_counter()
            scratch = tempfile.mkdtemp(prefix="crucible-confine-")
            rep = confine.enter_worker(scratch, None, os.path.join(HERE, "..", "..", "env", "eval", "harness"), 64)
            t2 = time.perf_counter()
            os.write(w, json.dumps([t1 - t0, t2 - t1, rep]).encode())
            os._exit(0)
        os.close(w)
        data = b""
        while chunk := os.read(r, 65536):
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        fork_s, confine_s, layers = json.loads(data)
        forks.append(round(fork_s * 1e3, 1))
        confines.append(round(confine_s * 1e3, 1))
    print(json.dumps({"fork_ms": sorted(forks), "confine_ms": sorted(confines),
                      "fork_median_ms": statistics.median(forks), "confine_median_ms": statistics.median(confines),
                      "isolation": layers}))


if __name__ == "__main__":
    main()
