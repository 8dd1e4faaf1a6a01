#!/usr/bin/env python3
"""What `crucible serve` adds to a verdict (docs/PERFORMANCE.md, "The service"): the same pairs
judged through the service and by `crucible eval --pairs` in one process, side by side in one run.

  python3 tools/bench/serve_overhead.py --crucible build/tools/crucible [--device cpu] [--pairs N]

It starts `crucible serve` on a free loopback port with --no-cache, then
  - latency: N requests one after the other, each the verdict's own wall time (the evaluator's)
    against the client's round trip: the added latency is their difference (median, max);
  - throughput: the same N pairs as one batch through the service, and as a TSV through
    `crucible eval --pairs` (one process, the same evaluator settings): verdicts per minute each.
The pairs are the CPU suite's correct variants (env/tasks/cpu/variants, not wrong_*), the first N.
Extra evaluator settings: --set KEY=VALUE (repeatable), passed to both. Prints one JSON object.
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python"))
from crucible_client import Client  # noqa: E402


def pairs(n):
    suite = ROOT / "env" / "tasks" / "cpu"
    out = []
    for task in sorted(suite.glob("*.py")):
        for cand in sorted((suite / "variants" / task.stem).glob("*.py")):
            if not cand.name.startswith("wrong_") and not cand.name.startswith("cpp_"):
                out.append((task, cand))
    return out[:n]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crucible", default=str(ROOT / "build" / "tools" / "crucible"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    a = ap.parse_args()
    sets = [x for kv in a.sets for x in ("--set", kv)]
    todo = pairs(a.pairs)
    with tempfile.TemporaryDirectory() as tmp:
        token = pathlib.Path(tmp) / "token"
        token.write_text("bench-token-" + os.urandom(12).hex() + "\n")
        token.chmod(0o600)
        proc = subprocess.Popen([a.crucible, "serve", "--listen", "127.0.0.1:0", "--token-file", str(token), "--device",
                                 a.device, "--suite", str(ROOT / "env" / "tasks" / "cpu"), "--no-cache", *sets],
                                stdout=subprocess.PIPE, text=True)
        m = re.search(r"listening on (http://[\d.]+:\d+)", proc.stdout.readline())
        if not m:
            proc.kill()
            sys.exit("serve_overhead: crucible serve did not start")
        client = Client(m.group(1), token.read_text().strip())
        try:
            added = []
            for task, cand in todo:
                t0 = time.monotonic()
                v = client.evaluate(task=task.stem, candidate=cand.read_text())
                added.append(time.monotonic() - t0 - v["wall_s"])
            t0 = time.monotonic()
            batch = client.evaluate_batch([{"task": t.stem, "candidate": c.read_text()} for t, c in todo])
            serve_s = time.monotonic() - t0
        finally:
            proc.terminate()
            proc.wait(timeout=120)
        tsv = pathlib.Path(tmp) / "pairs.tsv"
        tsv.write_text("".join(f"{t}\t{c}\n" for t, c in todo))
        t0 = time.monotonic()
        r = subprocess.run([a.crucible, "eval", "--pairs", str(tsv), "--device", a.device, "--no-cache", "--json", *sets],
                           capture_output=True, text=True)
        eval_s = time.monotonic() - t0
        if r.returncode != 0:
            sys.exit("serve_overhead: crucible eval --pairs failed: " + r.stderr[-500:])
    print(json.dumps({
        "pairs": len(todo), "device": a.device,
        "added_latency_ms": {"median": 1000 * statistics.median(added), "max": 1000 * max(added)},
        "serve_batch_s": serve_s, "eval_pairs_s": eval_s,
        "verdicts_per_min": {"serve": 60 * len(todo) / serve_s, "eval_pairs": 60 * len(todo) / eval_s},
        "statuses": sorted({v.get("status", "error") for v in batch}),
    }, indent=1))


if __name__ == "__main__":
    main()
