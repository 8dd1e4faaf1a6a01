#!/usr/bin/env python3
"""tools/report_plots.py: a run's metrics.jsonl -> the report's plots, drawn with matplotlib.

    tools/report_plots.py RUN OUT

reads RUN/metrics.jsonl (docs/report.md; the records of docs/training.md, "What a run writes"),
writes one PNG per plot into OUT (created if needed) and prints one JSON object on standard
output, the plots in display order:

    {"plots": [{"id": "sft_loss", "file": "sft_loss.png", "title": "...", "caption": "..."}, ...]}

The output is ASCII (non-ASCII characters of titles and captions as \\u escapes). `crucible
report` embeds the PNGs in report.html in that order, each with its caption under it.

- RUN without a metrics.jsonl: an empty run, {"plots": []} and exit 0.
- Whatever follows the file's last newline is a torn line (an append in flight) and is left out,
  as storage/metrics_log.cpp's read_metrics() does.
- A line that is not a JSON object, a record without a string `event`/`kind`, or a field of the
  wrong type: a message naming FILE:LINE (and the key) on standard error, nothing written, exit 2.
  An unreadable file or an unwritable OUT: exit 1.

One figure never spans two stages: each stage's steps (a run of consecutive steps of one `stage`)
get their own x axis, from the stage's first step to its last. The same input gives the same
PNG bytes (fixed style and fonts, no timestamps).
"""
from __future__ import annotations

import json
import os
import sys
from collections import Counter, OrderedDict
from pathlib import Path

# The figures and the records are drawn and read by the modules beside this file (report_*.py);
# they are found there also where this file is loaded by path (tests/python).
TOOLS = str(Path(__file__).resolve().parent)
if TOOLS not in sys.path:
    sys.path.append(TOOLS)

import matplotlib  # noqa: E402

from report_draw import DPI, STYLE, Plot  # noqa: E402
from report_records import STAGE_LABELS, BadInput, RunData, collect, learning_progress, read_records  # noqa: E402
from report_run_plots import (plot_best_per_task, plot_gpu_busy, plot_hardware, plot_limit, plot_status,  # noqa: E402
                              plot_turns)
from report_stage_plots import (_ident, plot_learning, plot_loss_stage, plot_sampling_stage,  # noqa: E402
                                plot_tasks, plot_turns_steps)

PROG = "report_plots"


# -- the run's plots ------------------------------------------------------------------------------

def make_plots(data: RunData) -> list[Plot]:
    """Every plot the data has, in display order: each stage's steps in step order (with, after a
    sampling stage's, its learning summary, per-task panels and turns), then the run-wide ones."""
    plots: list[Plot] = []
    done_stages: set[str] = set()
    for seg in data.segments:
        if seg.sampling:
            plots.append(plot_sampling_stage(seg, data))
            t = plot_turns_steps(seg)
            if t:
                plots.append(t)
            if seg.stage in done_stages:
                continue
            done_stages.add(seg.stage)
            label = STAGE_LABELS.get(seg.stage, seg.stage.replace("_", " ").capitalize())
            p = learning_progress(data, seg.stage)
            if p is not None and p.steps >= 2:  # one step has no first and last third
                plots.append(plot_learning(p, label, f"{_ident(seg.stage)}_learning"))
            for q in ("correct", "speedup"):
                t = plot_tasks(data, seg.stage, label, q)
                if t:
                    plots.append(t)
        elif any(s.loss is not None for s in seg.steps):
            plots.append(plot_loss_stage(seg))
    # Sampled verdicts of stages without sampling train_steps (e.g. a run stopped before its first
    # RL update): their per-task panels still show.
    for stage in OrderedDict.fromkeys(v.stage for v in data.verdicts):
        if stage in done_stages or stage in ("warm_start", "sft"):
            continue
        label = STAGE_LABELS.get(stage, stage.replace("_", " ").capitalize() or "Samples")
        for q in ("correct", "speedup"):
            t = plot_tasks(data, stage, label, q)
            if t:
                plots.append(t)
    for fn in (plot_turns, plot_best_per_task, plot_limit, plot_status, plot_hardware, plot_gpu_busy):
        p = fn(data)
        if p:
            plots.append(p)
    ids = Counter(p.id for p in plots)
    assert all(n == 1 for n in ids.values()), f"plot ids repeat: {ids}"
    return plots


def save(plot: Plot, out: Path) -> Path:
    path = out / f"{plot.id}.png"
    tmp = out / f".{plot.id}.png.tmp"
    with matplotlib.rc_context(STYLE):
        plot.figure.savefig(tmp, format="png", dpi=DPI, metadata={"Software": None}, facecolor="white")
    os.replace(tmp, path)
    return path


def run(run_dir: Path, out: Path) -> dict:
    """Draws RUN's plots into OUT; returns the manifest."""
    if not run_dir.is_dir():
        raise BadInput(f"{run_dir}: not a directory")
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return {"plots": []}
    data = collect(read_records(metrics), str(metrics))
    plots = make_plots(data)
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for p in plots:
        save(p, out)
        manifest.append({"id": p.id, "file": f"{p.id}.png", "title": p.title, "caption": p.caption})
    return {"plots": manifest}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1].startswith("-"):
        print(f"usage: {PROG}.py RUN OUT", file=sys.stderr)
        return 2
    try:
        manifest = run(Path(argv[1]), Path(argv[2]))
    except BadInput as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(manifest) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
