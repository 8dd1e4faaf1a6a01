#!/usr/bin/env python3
"""Where the device's wall time goes in one bench_eval_throughput pass.

    bench_eval_throughput --device cuda:0 --concurrency 6 --candidates 40 --timeline tl.txt
    python3 tools/bench/gate_timeline.py tl.txt

Reads the timeline (device-gate steps and evaluation phases) and splits the pass's wall time
into: timing (and the parts of it beside starting workers' held initialisation and beside other
evaluations' untimed work, in warm-up); a timing's measured rounds waiting for those to finish
("measure wait", not timing); a ready
timing waiting for untimed work to finish ("drain"); untimed work with no timing waiting; and the
device unused. Untimed and unused time is attributed to what
the evaluations and starting workers were doing then. Also prints each phase's mean length
per verdict, with the part spent waiting for the gate.
"""
import argparse
import collections
import statistics
import sys


def load(path):
    events = []  # (ns, order, kind, fields)
    start = end = None
    order = 0
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            parts = line.split()
            tag = parts[0]
            if tag == "S":
                start = int(parts[1])
            elif tag == "F":
                end = int(parts[1])
            elif tag == "G":
                events.append((int(parts[1]), order, "G", (parts[2], parts[3])))
            elif tag == "P":
                events.append((int(parts[1]), order, "P", (parts[2], parts[3], " ".join(parts[4:]))))
            elif tag == "E":
                events.append((int(parts[1]), order, "E", (parts[2], parts[3], " ".join(parts[4:]))))
            order += 1
    if start is None or end is None:
        sys.exit(f"{path}: no S or F line: not a bench_eval_throughput --timeline file")
    events.sort()
    return start, end, events


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): "
                                        "evaluator throughput, where the wall goes\n"
                                        "(tools/bench/gpu_session.sh throughput runs it). No environment variables.")
    ap.add_argument("timeline")
    args = ap.parse_args()
    start, end, events = load(args.timeline)
    wall = (end - start) * 1e-9

    phase = {}  # evaluation thread -> its current phase ("worker" before the first)
    eval_threads = set()
    untimed = set()  # threads inside as untimed users
    starts = set()  # threads inside as starting workers' held initialisation
    timed = None
    measure_waiting = False  # the timed user waits for starts (and untimed users) before its measured rounds
    timed_waiting = 0
    waiting_since = {}  # thread -> ns it started waiting at the gate
    states = collections.Counter()  # state -> seconds
    blame = collections.Counter()  # (state, what) -> seconds
    phase_s = collections.defaultdict(float)  # phase -> seconds summed over evaluations
    gate_wait_s = collections.defaultdict(float)  # phase -> seconds of it spent waiting at the gate
    phase_since = {}
    verdicts = 0

    def holder_label(t):
        if t not in eval_threads:
            # Threads of the evaluator's own: the refill's starts, the retire thread's teardowns.
            return "worker initialisation (refill)" if t in starts else "worker teardown"
        p = phase.get(t, "worker")
        return "worker initialisation (inline)" if p == "worker" else p

    def label_of(labels):
        c = collections.Counter(labels)
        return ", ".join(f"{k}" + (f" x{n}" if n > 1 else "") for k, n in sorted(c.items()))

    last = start
    for ns, _, kind, f in events:
        dt = (ns - last) * 1e-9
        if dt > 0 and ns >= start:
            if timed is not None and measure_waiting:
                states["measure wait"] += dt
                blame[("measure wait", label_of(holder_label(t) for t in untimed | starts))] += dt
            elif timed is not None:
                states["timed"] += dt
                if starts:
                    states["timed: beside starts"] += dt
                if untimed:
                    states["timed: beside untimed work"] += dt
            elif untimed or starts:
                st = "drain" if timed_waiting else "untimed only"
                states[st] += dt
                blame[(st, label_of(holder_label(t) for t in untimed | starts))] += dt
            else:
                states["unused"] += dt
                doing = [phase.get(t, "worker") for t in eval_threads if phase.get(t) != "idle"]
                blame[("unused", label_of(doing) if doing else "no evaluation")] += dt
        last = max(last, ns)
        if kind == "E":
            t, what, rest = f
            eval_threads.add(t)
            if what == "begin":
                phase[t] = "worker"
                phase_since[t] = ns
            else:
                p = phase.get(t)
                if p is not None and t in phase_since:
                    phase_s[p] += (ns - phase_since[t]) * 1e-9
                phase[t] = "idle"
                verdicts += 1
        elif kind == "P":
            t, pid, name = f
            p = phase.get(t)
            if p is not None and t in phase_since:
                phase_s[p] += (ns - phase_since[t]) * 1e-9
            phase[t] = name
            phase_since[t] = ns
        else:
            t, k = f
            if k in ("w", "W", "v"):
                waiting_since[t] = ns
                if k == "W":
                    timed_waiting += 1
            elif k in ("u", "c"):  # an untimed user or a start enters
                (untimed if k == "u" else starts).add(t)
                if t in waiting_since:
                    # the wait belongs to the phase the thread enters next; attribute to the current label
                    what = " -> untimed" if k == "u" else " -> start"
                    gate_wait_s[holder_label(t) + what] += (ns - waiting_since.pop(t)) * 1e-9
            elif k in ("x", "y"):  # ... leaves
                (untimed if k == "x" else starts).discard(t)
            elif k == "M":
                measure_waiting = True
            elif k == "m":
                measure_waiting = False
            elif k == "T":
                if t in waiting_since:
                    timed_waiting -= 1
                    gate_wait_s["timing wait"] += (ns - waiting_since.pop(t)) * 1e-9
                timed = t
            elif k == "X":
                timed = None
                measure_waiting = False

    print(f"{args.timeline}: {verdicts} verdicts in {wall:.2f} s")
    for st in ("timed", "measure wait", "drain", "untimed only", "unused"):
        print(f"  {st:14s} {states[st]:7.2f} s  {100 * states[st] / wall:5.1f}% of wall  {states[st] / max(verdicts, 1) * 1e3:6.1f} ms/verdict")
        if st == "timed":
            for what in ("starts", "untimed work"):
                part = states["timed: beside " + what]
                print(f"    of it beside {what + ' (warm-up)':20s} {part:7.2f} s  {100 * part / wall:5.1f}% of wall  "
                      f"{part / max(verdicts, 1) * 1e3:6.1f} ms/verdict")
    for st in ("measure wait", "drain", "untimed only", "unused"):
        rows = sorted(((s, w) for (x, w), s in blame.items() if x == st), reverse=True)
        if not rows:
            continue
        print(f"  {st}, by what was going on:")
        for s, w in rows[:12]:
            print(f"    {100 * s / wall:5.1f}%  {s / max(verdicts, 1) * 1e3:6.1f} ms/verdict  {w}")
    print("  phases, mean per verdict (the phase's name is the one entered; the time runs to the next):")
    for p, s in sorted(phase_s.items(), key=lambda x: -x[1]):
        print(f"    {s / max(verdicts, 1) * 1e3:7.1f} ms  {p}")
    print("  gate waits, mean per verdict:")
    for p, s in sorted(gate_wait_s.items(), key=lambda x: -x[1]):
        print(f"    {s / max(verdicts, 1) * 1e3:7.1f} ms  {p}")


if __name__ == "__main__":
    main()
