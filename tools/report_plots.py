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
import math
import os
import re
import statistics
import sys
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.ticker as mticker  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

PROG = "report_plots"
DPI = 110
WIDTH = 8.0  # inches; 880 px at DPI
HEIGHT = 4.5
MAX_TASK_PANELS = 12  # per-task small multiples: the most sampled tasks
MAX_BAR_TASKS = 40  # best speedup per task: the fastest tasks
MAX_POINTS = 40  # per-task panels: more sampled steps than this are pooled into windows
SMOOTH_FROM = 30  # a line of more steps than this also gets a moving mean

# A fixed style (not the user's matplotlibrc): the same input draws the same pixels.
STYLE: dict[str, Any] = {
    "font.family": "DejaVu Sans",
    "font.size": 10,
    "axes.titlesize": 10.5,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "figure.titlesize": 12,
    "axes.grid": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.prop_cycle": matplotlib.cycler(
        color=["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]),
    "lines.linewidth": 1.6,
    "lines.markersize": 4.5,
    "legend.frameon": True,
    "legend.framealpha": 0.85,
    "savefig.dpi": DPI,
    "figure.dpi": DPI,
    "path.simplify": False,
}

STAGE_LABELS = {"sft": "SFT", "rl": "RL", "self_supervised": "Self-supervised", "search": "Search",
                "warm_start": "Warm start", "sampling": "Sampling", "training": "Training"}

SPEEDUP_LABEL = "speedup (\u00d7, candidate over reference)"
SHARE_LABEL = "share of samples (%)"
NATS_LABEL = "loss (nats/token)"
TIMES = "\u00d7"


class BadInput(Exception):
    """Input that is not a run's metrics (exit 2); the message names the file, line and key."""


# -- records ------------------------------------------------------------------------------------

def read_records(path: Path) -> list[tuple[int, dict]]:
    """The records of metrics.jsonl as (line number, object); the torn tail left out."""
    data = path.read_bytes()
    end = data.rfind(b"\n")
    lines = data[:end + 1].split(b"\n")[:-1] if end >= 0 else []
    out = []
    for i, raw in enumerate(lines, start=1):
        where = f"{path}:{i}"
        try:
            rec = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise BadInput(f"{where}: not JSON: {e}") from None
        if not isinstance(rec, dict):
            raise BadInput(f"{where}: expected a JSON object, got {_kind_name(rec)}")
        key = "event" if "event" in rec else "kind"
        if key not in rec:
            raise BadInput(f"{where}: record has no 'event' or 'kind' key")
        if not isinstance(rec[key], str):
            raise BadInput(f"{where}: key '{key}': expected a string, got {_kind_name(rec[key])}")
        out.append((i, rec))
    return out


def _kind_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


class _Fields:
    """Typed reads of one record; a wrong type raises BadInput naming the file, line and key."""

    def __init__(self, rec: dict, where: str):
        self.rec, self.where = rec, where

    def _wrong(self, key: str, expected: str) -> BadInput:
        return BadInput(f"{self.where}: key '{key}': expected {expected}, got {_kind_name(self.rec[key])}")

    def integer(self, key: str, required: bool = False) -> int | None:
        if key not in self.rec:
            if required:
                raise BadInput(f"{self.where}: key '{key}': missing")
            return None
        v = self.rec[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise self._wrong(key, "a non-negative integer")
        return v

    def number(self, key: str) -> float | None:
        v = self.rec.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self._wrong(key, "a number or null")
        return float(v)

    def string(self, key: str, required: bool = False) -> str | None:
        if key not in self.rec:
            if required:
                raise BadInput(f"{self.where}: key '{key}': missing")
            return None
        v = self.rec[key]
        if not isinstance(v, str):
            raise self._wrong(key, "a string")
        return v


@dataclass
class Step:
    """One train_step record's plotted fields."""
    step: int
    stage: str
    loss: float | None = None
    mean_reward: float | None = None
    correct_share: float | None = None
    format_error_share: float | None = None
    mean_speedup: float | None = None
    best_speedup: float | None = None
    samples: int | None = None
    skipped: bool = False
    turns: list[tuple[int, int, float | None, float | None]] = field(default_factory=list)

    @property
    def sampling(self) -> bool:
        return self.mean_reward is not None or self.correct_share is not None or self.samples is not None


@dataclass
class Verdict:
    stage: str
    step: int | None
    task: str
    status: str
    correct: bool  # correct with a speedup, as learning_progress() counts it
    speedup: float | None
    hardware: str | None
    turn: int | None
    segment: int  # the process that wrote it (run_started / run_resumed start a new one)


@dataclass
class Segment:
    """A stage's consecutive steps: one x axis."""
    stage: str
    ordinal: int  # 1 for the stage's first run of steps, 2 for its second, ...
    steps: list[Step]

    @property
    def id(self) -> str:
        base = re.sub(r"[^a-z0-9_]+", "_", self.stage.lower()).strip("_") or "steps"
        return base if self.ordinal == 1 else f"{base}_{self.ordinal}"

    @property
    def label(self) -> str:
        name = STAGE_LABELS.get(self.stage, self.stage.replace("_", " ").capitalize() or "Steps")
        return name if self.ordinal == 1 else f"{name} ({self.ordinal})"

    @property
    def first(self) -> int:
        return self.steps[0].step

    @property
    def last(self) -> int:
        return self.steps[-1].step

    @property
    def sampling(self) -> bool:
        return any(s.sampling for s in self.steps)


@dataclass
class RunData:
    segments: list[Segment]
    verdicts: list[Verdict]
    lifecycle: list[dict]  # run_* records, in order
    devices: tuple[dict, list[dict]] | None  # the last lifecycle record with devices, its devices


def collect(records: Iterable[tuple[int, dict]], source: str = "metrics.jsonl") -> RunData:
    """The plotted data of a run's records; a field of the wrong type raises BadInput."""
    steps: dict[int, Step] = {}  # a step redone after a crash: its last record
    verdicts: list[Verdict] = []
    lifecycle: list[dict] = []
    devices = None
    segment = 0
    for line, rec in records:
        kind = rec["event"] if "event" in rec else rec["kind"]
        f = _Fields(rec, f"{source}:{line}")
        if kind == "train_step":
            n = f.integer("step", required=True)
            stage = f.string("stage") or ""
            s = Step(n, stage, loss=f.number("loss"), mean_reward=f.number("mean_reward"),
                     correct_share=f.number("correct_share"), format_error_share=f.number("format_error_share"),
                     mean_speedup=f.number("mean_speedup"), best_speedup=f.number("best_speedup"),
                     samples=f.integer("samples"), skipped=rec.get("skipped") is True)
            if not stage:  # records without a stage (older runs): by what they hold
                s.stage = "sampling" if s.sampling else "training"
            turns = rec.get("turns")
            if isinstance(turns, list):
                for t in turns:
                    if not isinstance(t, dict):
                        continue
                    tf = _Fields(t, f"{source}:{line}: turns")
                    turn, samples = tf.integer("turn"), tf.integer("samples")
                    if turn is not None and samples is not None:
                        s.turns.append((turn, samples, tf.number("correct_share"), tf.number("mean_speedup")))
            steps[n] = s
        elif kind.startswith("run_"):
            f.integer("step", required=True)
            f.number("best_speedup")
            f.number("mean_speedup")
            if kind in ("run_started", "run_resumed"):
                segment += 1
            lifecycle.append(rec)
            devs = rec.get("devices")
            if isinstance(devs, list):
                good = [d for d in devs if isinstance(d, dict) and isinstance(d.get("device"), str)
                        and _is_number(d.get("seconds"))]
                if good:
                    devices = (rec, good)
        elif kind == "verdict":
            task = f.string("task", required=True)
            status = f.string("status", required=True)
            speedup = f.number("speedup")
            hardware = f.string("hardware")
            turn = f.integer("turn")
            step = rec.get("step")
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                step = None
            correct = rec.get("correct") is True and speedup is not None and not math.isnan(speedup)
            verdicts.append(Verdict(f.string("stage") or "", step, task, status, correct, speedup, hardware, turn,
                                    segment))
    ordered = [steps[k] for k in sorted(steps)]
    segments: list[Segment] = []
    seen: Counter = Counter()
    for s in ordered:
        if segments and segments[-1].stage == s.stage:
            segments[-1].steps.append(s)
        else:
            seen[s.stage] += 1
            segments.append(Segment(s.stage, seen[s.stage], [s]))
    return RunData(segments, verdicts, lifecycle, devices)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def stage_verdicts(verdicts: list[Verdict], stage: str) -> dict[int, list[Verdict]]:
    """A stage's verdicts by step; a step sampled again after a resume keeps its later verdicts
    (as learning_progress() in storage/report.cpp does)."""
    by_step: dict[int, list[Verdict]] = {}
    for v in verdicts:
        if v.stage != stage or v.step is None:
            continue
        at = by_step.setdefault(v.step, [])
        if at and at[0].segment != v.segment:
            at.clear()
        at.append(v)
    return dict(sorted(by_step.items()))


# -- the learning summary (storage/report.cpp, learning_progress()) --------------------------------

@dataclass
class Progress:
    stage: str
    steps: int
    window: int
    first_steps: tuple[int, int]
    last_steps: tuple[int, int]
    first_correct: float
    last_correct: float
    first_speedup: float  # NaN: no correct sample
    last_speedup: float
    first_samples: int
    last_samples: int
    tasks: int = 0  # tasks sampled in both windows
    first_task_correct: float = math.nan
    last_task_correct: float = math.nan
    speedup_tasks: int = 0  # of those, tasks with a correct sample in both
    first_task_speedup: float = math.nan
    last_task_speedup: float = math.nan


def learning_progress(data: RunData, stage: str) -> Progress | None:
    """The first third of a sampling stage's steps against its last third: pooled over samples
    (train_step records) and with each task weighted equally (verdict records)."""
    rows = [s for seg in data.segments if seg.stage == stage for s in seg.steps
            if s.samples is not None and s.correct_share is not None]
    if not rows:
        return None
    w = max(1, len(rows) // 3)

    def pool(part: list[Step]) -> tuple[float, float, int]:
        n = sum(s.samples for s in part)
        c = sum(s.correct_share * s.samples for s in part)
        total = sum((s.mean_speedup or 0.0) * s.correct_share * s.samples for s in part
                    if s.mean_speedup is not None and not math.isnan(s.mean_speedup))
        return (c / n if n else 0.0), (total / c if c > 0.5 else math.nan), n

    c0, s0, n0 = pool(rows[:w])
    c1, s1, n1 = pool(rows[-w:])
    p = Progress(stage, len(rows), w, (rows[0].step, rows[w - 1].step), (rows[-w].step, rows[-1].step),
                 c0, c1, s0, s1, n0, n1)
    by_step = stage_verdicts(data.verdicts, stage)
    if by_step:
        keys = list(by_step)
        vw = min(w, len(keys))
        tally: dict[str, list[list[float]]] = defaultdict(lambda: [[0, 0, 0.0], [0, 0, 0.0]])
        for i, k in enumerate(keys):
            for part, inside in ((0, i < vw), (1, i >= len(keys) - vw)):
                if not inside:
                    continue
                for v in by_step[k]:
                    t = tally[v.task][part]
                    t[0] += 1
                    if v.correct:
                        t[1] += 1
                        t[2] += v.speedup
        cc = [0.0, 0.0]
        ss = [0.0, 0.0]
        for task in sorted(tally):
            t = tally[task]
            if t[0][0] == 0 or t[1][0] == 0:
                continue
            p.tasks += 1
            for k in (0, 1):
                cc[k] += t[k][1] / t[k][0]
            if t[0][1] and t[1][1]:
                p.speedup_tasks += 1
                for k in (0, 1):
                    ss[k] += t[k][2] / t[k][1]
        if p.tasks:
            p.first_task_correct, p.last_task_correct = cc[0] / p.tasks, cc[1] / p.tasks
        if p.speedup_tasks:
            p.first_task_speedup, p.last_task_speedup = ss[0] / p.speedup_tasks, ss[1] / p.speedup_tasks
    return p


# -- drawing helpers ----------------------------------------------------------------------------

@dataclass
class Plot:
    id: str
    title: str
    caption: str
    figure: Figure


def _figure(height: float = HEIGHT, width: float = WIDTH) -> Figure:
    with matplotlib.rc_context(STYLE):
        return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _styled(fn: Callable) -> Callable:
    """Draw under the fixed style."""
    def wrapper(*a, **kw):
        with matplotlib.rc_context(STYLE):
            return fn(*a, **kw)
    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


def _step_axis(ax, first: int, last: int, ticks: int = 8) -> None:
    """x from the stage's first step to its last; integer ticks; half a step of room when few."""
    pad = 0.5 if last - first < 20 else 0.0
    if first == last:
        pad = 0.5
    ax.set_xlim(first - pad, last + pad)
    ax.xaxis.set_major_locator(mticker.MaxNLocator(nbins=ticks, integer=True, min_n_ticks=2))
    ax.set_xlabel("step")


def _times_formatter(v: float, _pos: Any = None) -> str:
    if v <= 0:
        return ""
    return f"{v:g}{TIMES}"


def _wants_log(values: Iterable[float]) -> bool:
    """Speedups spanning more than 10x read better on a log axis."""
    vals = [v for v in values if v is not None and not math.isnan(v) and v > 0]
    return bool(vals) and max(vals) / min(vals) > 10


def _speedup_axis(ax, values: Iterable[float], label: str = SPEEDUP_LABEL) -> bool:
    """Log scale where the speedups span more than 10x; 1x marked. Returns whether log."""
    vals = [v for v in values if v is not None and not math.isnan(v) and v > 0]
    log = _wants_log(vals)
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(mticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_locator(mticker.NullLocator())
    else:
        ax.set_ylim(bottom=0, top=max(vals) * 1.12 if vals else None)
    ax.yaxis.set_major_formatter(mticker.FuncFormatter(_times_formatter))
    ax.axhline(1.0, color="#888888", linewidth=0.9, linestyle=":", zorder=0.5)
    ax.set_ylabel(label)
    return log


def _arr(values: Iterable[float | None]) -> np.ndarray:
    return np.array([math.nan if v is None else v for v in values], dtype=float)


def _moving_mean(y: np.ndarray, w: int, geometric: bool = False) -> np.ndarray:
    """Centred mean over w points (fewer at the ends), NaNs skipped; `geometric` for a log axis."""
    if geometric:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.exp(_moving_mean(np.where(y > 0, np.log(y), math.nan), w))
    out = np.full_like(y, math.nan)
    h = w // 2
    for i in range(len(y)):
        part = y[max(0, i - h):i + h + 1]
        part = part[~np.isnan(part)]
        if len(part):
            out[i] = part.mean()
    return out


def _smooth_window(n: int) -> int:
    return max(5, (n // 20) | 1)


def _line(ax, x: np.ndarray, y: np.ndarray, label: str, colour: str, style: str = "-", geometric: bool = False,
          raw_in_legend: bool = False) -> None:
    """A series; with many steps a thin line of each step under a thick moving mean, the legend
    naming the series once (the caption says which line is which) unless `raw_in_legend`."""
    n = len(x)
    if n > SMOOTH_FROM:
        w = _smooth_window(n)
        ax.plot(x, y, style, color=colour, linewidth=0.8, alpha=0.35,
                label=f"{label}, each step" if raw_in_legend else f"_{label}, each step")
        ax.plot(x, _moving_mean(y, w, geometric), style, color=colour, linewidth=2.0,
                label=f"{label}, mean of {w} steps" if raw_in_legend else label)
    else:
        marker = "o" if n <= 60 else None
        ax.plot(x, y, style, color=colour, marker=marker, label=label)


def _legend(ax, **kw) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if len(handles) > 1:
        ax.legend(**kw)


def _legend_on_top(ax, width_in: float = 3.0) -> None:
    """A legend where more than one series: in a strip added above the data, so that it covers
    none of them. As many columns as fit in about width_in inches."""
    handles, labels = ax.get_legend_handles_labels()
    if len(handles) < 2:
        return
    avail = width_in * 72
    ncols = 1
    for k in range(len(labels), 0, -1):
        rows = [labels[i:i + k] for i in range(0, len(labels), k)]
        if max(sum(len(t) * 5.4 + 38 for t in row) for row in rows) <= avail:
            ncols = k
            break
    nrows = math.ceil(len(labels) / ncols)
    grid_rows = ax.get_subplotspec().get_gridspec().nrows
    axes_h = max(1.0, ax.figure.get_size_inches()[1] / grid_rows - 0.9)  # less titles and labels
    frac = min(0.5, (0.2 + 0.2 * nrows) / axes_h)  # of the axes' height: the legend's rows and margins
    lo, hi = ax.get_ylim()
    ticks = [t for t in ax.get_yticks() if lo <= t <= hi]  # none in the strip: it holds no data
    if ax.get_yscale() == "log":
        llo, lhi = math.log10(lo), math.log10(hi)
        ax.set_ylim(lo, 10 ** (llo + (lhi - llo) / (1 - frac)))
    else:
        ax.set_ylim(lo, lo + (hi - lo) / (1 - frac))
    ax.set_yticks(ticks)
    ax.legend(loc="upper center", ncols=ncols, borderaxespad=0.3)


def _fmt_x(v: float) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.2f}{TIMES}"


def _pct(v: float) -> str:
    return "-" if v is None or math.isnan(v) else f"{100 * v:.1f}%"


def _short(name: str, n: int = 34) -> str:
    """At most n characters: a task's name keeps its start (level and number, then its words)."""
    return name if len(name) <= n else name[:n - 1] + "\u2026"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _steps_text(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"


# -- the plots ----------------------------------------------------------------------------------

@_styled
def plot_loss_stage(seg: Segment) -> Plot:
    """A stage without samples (SFT): its training loss against its own steps."""
    x = np.array([s.step for s in seg.steps], dtype=float)
    y = _arr(s.loss for s in seg.steps)
    fig = _figure()
    ax = fig.add_subplot()
    nats = seg.stage in ("sft", "self_supervised", "training")
    title = f"{seg.label}: training loss by step ({_steps_text(seg.first, seg.last)})"
    ax.set_title(title, fontsize=STYLE["figure.titlesize"])
    vals = y[~np.isnan(y)]
    log = len(vals) > 0 and vals.min() > 0 and vals.max() / vals.min() > 20
    _line(ax, x, y, "loss", "#1f77b4", geometric=log, raw_in_legend=True)
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(mticker.LogLocator(base=10, subs=(1.0,)))
        ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _p: f"{v:g}"))
    ax.set_ylabel((NATS_LABEL if nats else "loss") + (", log scale" if log else ""))
    _step_axis(ax, seg.first, seg.last)
    _legend(ax, loc="upper right")
    caption = (f"{seg.label} stage, {len(seg.steps)} updates ({_steps_text(seg.first, seg.last)}), from the "
               "train_step records' loss")
    if nats:
        caption += ": the mean negative log-likelihood of the target code's tokens, in nats per token"
    if len(vals):
        caption += f"; {vals[0]:.3g} at the first step, {vals[-1]:.3g} at the last, lowest {vals.min():.3g}"
    caption += "."
    if log:
        caption += " The y axis is logarithmic: the loss falls by orders of magnitude."
    if len(x) > SMOOTH_FROM:
        caption += (f" The thick line is the {'geometric ' if log else ''}mean of {_smooth_window(len(x))} steps "
                    "around each step.")
    caption += " This stage draws no samples, so it has no reward, correct share or speedup."
    return Plot(f"{seg.id}_loss", title, caption, fig)


@_styled
def plot_sampling_stage(seg: Segment, data: RunData) -> Plot:
    """A sampling stage (RL): correct share, speedup, reward and loss against its own steps."""
    st = seg.steps
    x = np.array([s.step for s in st], dtype=float)
    fig = _figure(height=6.0)
    axs = fig.subplots(2, 2)
    title = f"{seg.label}: samples and updates by step ({_steps_text(seg.first, seg.last)})"
    fig.suptitle(title)

    ax = axs[0][0]
    ax.set_title("Correct samples")
    _line(ax, x, 100 * _arr(s.correct_share for s in st), "correct", "#2ca02c")
    if any(s.format_error_share is not None for s in st):
        _line(ax, x, 100 * _arr(s.format_error_share for s in st), "format errors", "#d62728", style="--")
    ax.set_ylim(-3, 103)
    ax.set_yticks([0, 20, 40, 60, 80, 100])
    ax.set_ylabel(SHARE_LABEL)
    _step_axis(ax, seg.first, seg.last, ticks=6)
    _legend_on_top(ax)

    ax = axs[0][1]
    ax.set_title("Speedup")
    mean = _arr(s.mean_speedup for s in st)
    best = _arr(s.best_speedup for s in st)
    if not np.all(np.isnan(mean)):
        _line(ax, x, mean, "mean of correct samples", "#1f77b4",
              geometric=_wants_log(list(mean) + list(best)))
    if not np.all(np.isnan(best)):
        ax.plot(x, best, "--", color="#ff7f0e", label="run's best so far")
    log = _speedup_axis(ax, list(mean) + list(best))
    if np.all(np.isnan(mean)) and np.all(np.isnan(best)):
        ax.text(0.5, 0.5, "no correct sample yet", transform=ax.transAxes, ha="center", va="center",
                color="#555555")
    _step_axis(ax, seg.first, seg.last, ticks=6)
    _legend_on_top(ax)

    ax = axs[1][0]
    ax.set_title("Mean reward")
    _line(ax, x, _arr(s.mean_reward for s in st), "mean reward", "#9467bd")
    ax.set_ylabel("mean reward per sample")
    rewards = [s.mean_reward for s in st if s.mean_reward is not None]
    if rewards and min(rewards) >= 0:
        ax.set_ylim(bottom=0, top=max(rewards) * 1.1 if max(rewards) > 0 else 1.0)
    _step_axis(ax, seg.first, seg.last, ticks=6)
    _legend_on_top(ax)

    ax = axs[1][1]
    updates = [s for s in st if not s.skipped]
    nats = seg.stage in ("self_supervised",)
    if seg.stage == "rl":
        ax.set_title("Loss (GRPO objective)")
        ylabel = "GRPO loss (surrogate, no unit)"
    else:
        ax.set_title("Loss")
        ylabel = NATS_LABEL if nats else "loss"
    _line(ax, x, _arr(s.loss if not s.skipped else None for s in st), "loss", "#8c564b")
    ax.set_ylabel(ylabel)
    _step_axis(ax, seg.first, seg.last, ticks=6)
    _legend_on_top(ax)

    caption = (f"{seg.label} stage, {len(st)} steps ({_steps_text(seg.first, seg.last)}), from the train_step "
               "records. Correct samples: the share of each step's samples that compiled, ran and matched the "
               "reference")
    if any(s.format_error_share is not None for s in st):
        caption += "; format errors: samples without usable code"
    caption += (". Speedup: the reference's time over the candidate's, as the mean over the step's correct "
                "samples (no point where none was correct) and the run's best so far, which includes the warm "
                "start's seed variants")
    if log:
        caption += "; logarithmic axis"
    caption += ". The dotted line marks 1\u00d7 (as fast as the reference). Mean reward: over all of the step's samples"
    if seg.stage == "rl":
        caption += ". Loss: the GRPO objective the update minimised (a surrogate; its level has no meaning of its own)"
    elif nats:
        caption += ". Loss: mean negative log-likelihood of the correct samples' tokens (nats per token)"
    if len(updates) < len(st):
        caption += f"; {len(st) - len(updates)} skipped updates have no loss point"
    caption += "."
    if len(x) > SMOOTH_FROM:
        caption += (f" Thin lines: each step; thick lines: the mean of {_smooth_window(len(x))} steps around "
                    "each step.")
    last = next((r for r in reversed(data.lifecycle) if _is_number(r.get("best_speedup"))), None)
    if last is not None:
        caption += (f" Run-wide at the last lifecycle record ({last.get('event')}, step {last.get('step')}): "
                    f"best {_fmt_x(float(last['best_speedup']))}")
        if _is_number(last.get("mean_speedup")):
            caption += f", mean {_fmt_x(float(last['mean_speedup']))}"
        if _is_number(last.get("variants")):
            caption += f" over {last['variants']} scored variants"
        caption += "."
    return Plot(f"{seg.id}_steps", title, caption, fig)


@_styled
def plot_learning(p: Progress, label: str, ident: str) -> Plot:
    """First third of a sampling stage's steps against its last third (learning_progress())."""
    fig = _figure()
    ax_c, ax_s = fig.subplots(1, 2)
    w = p.window
    first_l = f"first third: {_steps_text(*p.first_steps)}"
    last_l = f"last third: {_steps_text(*p.last_steps)}"
    title = f"{label}: first third of the steps against the last third ({p.steps} steps)"
    fig.suptitle(title)
    groups = ["all samples pooled"]
    if p.tasks:
        groups.append(f"each task weighted equally\n({_count(p.tasks, 'task')})")
    xs = np.arange(len(groups))
    bw = 0.38

    def bars(ax, first: list[float], last: list[float], fmt: Callable[[float], str], scale: float) -> None:
        for off, vals, lab, col in ((-bw / 2, first, first_l, "#9ecae1"), (bw / 2, last, last_l, "#1f77b4")):
            hv = [0.0 if math.isnan(v) else v * scale for v in vals]
            rects = ax.bar(xs + off, hv, bw, label=lab, color=col, edgecolor="#333333", linewidth=0.6)
            ax.bar_label(rects, labels=[("none" if math.isnan(v) else fmt(v)) for v in vals],
                         padding=2, fontsize=9)
        ax.set_xticks(xs, groups)
        ax.grid(axis="x", visible=False)

    bars(ax_c, [p.first_correct] + ([p.first_task_correct] if p.tasks else []),
         [p.last_correct] + ([p.last_task_correct] if p.tasks else []), _pct, 100.0)
    ax_c.set_title("Correct samples")
    ax_c.set_ylabel(SHARE_LABEL)
    ax_c.set_ylim(0, 112)
    ax_c.set_yticks([0, 20, 40, 60, 80, 100])
    ax_c.set_xlabel("samples counted")

    sf = [p.first_speedup] + ([p.first_task_speedup] if p.tasks else [])
    sl = [p.last_speedup] + ([p.last_task_speedup] if p.tasks else [])
    bars(ax_s, sf, sl, _fmt_x, 1.0)
    ax_s.set_title("Mean speedup of the correct samples")
    ax_s.set_ylabel(SPEEDUP_LABEL)
    vals = [v for v in sf + sl if not math.isnan(v)]
    ax_s.set_ylim(0, (max(vals) if vals else 1.0) * 1.18)
    ax_s.yaxis.set_major_formatter(mticker.FuncFormatter(_times_formatter))
    ax_s.set_xlabel("samples counted")
    fig.legend(*ax_c.get_legend_handles_labels(), loc="outside lower center", ncols=2)

    caption = (f"{label} stage: the first {w} and the last {w} of its {p.steps} steps "
               f"({p.first_samples} and {p.last_samples} samples; the same comparison as the report's learning "
               f"lines). Correct samples {_pct(p.first_correct)} \u2192 {_pct(p.last_correct)}, mean speedup of "
               f"the correct samples {_fmt_x(p.first_speedup)} \u2192 {_fmt_x(p.last_speedup)}, pooled over the "
               "samples (train_step records): this follows the mix of tasks each third happened to draw.")
    if any(math.isnan(v) for v in sf + sl):
        caption += " \"none\": no correct sample, so no speedup."
    if p.tasks:
        caption += (f" With each of the {_count(p.tasks, 'task')} sampled in both thirds weighted equally (verdict "
                    "records): "
                    f"correct {_pct(p.first_task_correct)} \u2192 {_pct(p.last_task_correct)}, mean speedup "
                    f"{_fmt_x(p.first_task_speedup)} \u2192 {_fmt_x(p.last_task_speedup)}"
                    f" (over the {_count(p.speedup_tasks, 'task')} with a correct sample in both).")
    else:
        caption += " No task was sampled in both thirds, so there is no per-task comparison."
    return Plot(ident, title, caption, fig)


def _task_series(by_step: dict[int, list[Verdict]], tasks: list[str]):
    """Per task: x (step or window middle), correct share, median speedup of correct samples, n."""
    steps = list(by_step)
    width = 1 if len(steps) <= MAX_POINTS else math.ceil((steps[-1] - steps[0] + 1) / 30)
    windows: dict[int, list[Verdict]] = OrderedDict()
    for k in steps:
        windows.setdefault((k - steps[0]) // width, []).extend(by_step[k])
    out = {}
    for task in tasks:
        xs, cs, ms, ns = [], [], [], []
        for b, vs in windows.items():
            mine = [v for v in vs if v.task == task]
            if not mine:
                continue
            good = [v.speedup for v in mine if v.correct]
            xs.append(steps[0] + b * width + (width - 1) / 2)
            cs.append(100.0 * len(good) / len(mine))
            ms.append(statistics.median(good) if good else math.nan)
            ns.append(len(mine))
        out[task] = (np.array(xs), np.array(cs), np.array(ms), ns)
    return out, width


@_styled
def plot_tasks(data: RunData, stage: str, label: str, quantity: str) -> Plot | None:
    """Small multiples, one panel per task, of a sampling stage's correct share or median speedup
    per step (quantity "correct" or "speedup"), from its verdict records."""
    by_step = stage_verdicts(data.verdicts, stage)
    if not by_step:
        return None
    counts = Counter(v.task for vs in by_step.values() for v in vs)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    shown = sorted(ranked[:MAX_TASK_PANELS])
    series, width = _task_series(by_step, shown)
    if quantity == "speedup" and not any(np.any(~np.isnan(series[t][2])) for t in shown):
        return None
    n = len(shown)
    ncols = 1 if n == 1 else 2 if n in (2, 4) else 3
    nrows = math.ceil(n / ncols)
    fig = _figure(height=1.1 + 1.75 * nrows)
    axs = np.atleast_1d(fig.subplots(nrows, ncols, sharex=True, squeeze=False)).ravel()
    first, last = min(by_step), max(by_step)
    per = "step" if width == 1 else f"window of {width} steps"
    if quantity == "correct":
        title = f"{label}: correct samples per task, by {per}"
    else:
        title = f"{label}: median speedup of correct samples per task, by {per}"
    fig.suptitle(title)
    for ax, task in zip(axs, shown):
        x, c, m, ns = series[task]
        ax.set_title(task, fontsize=9)
        if quantity == "correct":
            ax.plot(x, c, "-o", color="#2ca02c", markersize=4)
            ax.set_ylim(-5, 105)
            ax.set_yticks([0, 50, 100])
            ax.set_ylabel("correct (%)")
        else:
            ok = ~np.isnan(m)
            ax.plot(x[ok], m[ok], "-o", color="#1f77b4", markersize=4)
            if not ok.all():  # (an empty unclipped line would stretch the layout to the origin)
                ax.plot(x[~ok], np.full(int((~ok).sum()), 0.04), "x", color="#d62728", markersize=6,
                        clip_on=False, transform=ax.get_xaxis_transform())
            vals = list(m[ok])
            if vals and max(vals) / min(vals) > 10:
                ax.set_yscale("log")
                ax.yaxis.set_minor_locator(mticker.NullLocator())
            else:
                ax.set_ylim(0, max(vals + [1.0]) * 1.2)
            ax.yaxis.set_major_locator(mticker.MaxNLocator(nbins=3) if ax.get_yscale() == "linear"
                                       else mticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=4))
            ax.yaxis.set_major_formatter(mticker.FuncFormatter(_times_formatter))
            ax.axhline(1.0, color="#888888", linewidth=0.9, linestyle=":", zorder=0.5)
            ax.set_ylabel(f"speedup ({TIMES})")
        _step_axis(ax, first, last, ticks=4 if ncols == 3 else 6)
        ax.tick_params(labelbottom=True)
    for ax in axs[n:]:
        ax.remove()
    _fit_titles(fig, list(zip(axs, shown)))
    what = ("the share of the task's samples that were correct" if quantity == "correct" else
            "the median speedup over the task's correct samples (a red \u00d7 at the bottom: sampled, none "
            "correct; dotted line: 1\u00d7, as fast as the reference)")
    caption = (f"{label} stage, from its {sum(counts.values())} verdict records ({_steps_text(first, last)}, "
               f"the step whose policy drew the samples): for each task, {what}, by {per}; a point only where "
               "the task was sampled.")
    if quantity == "speedup":
        caption += " Each panel has its own y axis."
    if len(ranked) > MAX_TASK_PANELS:
        caption += (f" The {MAX_TASK_PANELS} most sampled of {len(ranked)} tasks are shown "
                    f"({sum(counts[t] for t in shown)} of {sum(counts.values())} samples).")
    else:
        caption += f" All {len(ranked)} sampled tasks are shown; panels in the order of the task names."
    return Plot(f"{_ident(stage)}_tasks_{quantity}", title, caption, fig)


def _fit_titles(fig: Figure, panels: list[tuple[Any, str]]) -> None:
    """Shortens each panel's title (keeping its start) to the width of its axes: one layout pass
    measures them (another would cost as much as drawing the figure again)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    for ax, name in panels:
        width = ax.title.get_window_extent(renderer).width
        allowed = ax.get_window_extent(renderer).width * 1.04
        if width > allowed:
            n = max(8, int(len(name) * allowed / width * 0.95))  # characters differ in width: a margin
            ax.set_title(_short(name, n), fontsize=ax.title.get_fontsize())


def _ident(stage: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", stage.lower()).strip("_") or "samples"


@_styled
def plot_turns(data: RunData) -> Plot | None:
    """Multi-turn episodes: every verdict with a turn, correct share and speedup by turn."""
    vs = [v for v in data.verdicts if v.turn is not None]
    if not vs:
        return None
    turns = sorted({v.turn for v in vs})
    n = [sum(1 for v in vs if v.turn == t) for t in turns]
    good = [[v.speedup for v in vs if v.turn == t and v.correct and v.status == "ok"] for t in turns]
    share = [100.0 * len(g) / k for g, k in zip(good, n)]
    mean = [statistics.fmean(g) if g else math.nan for g in good]
    fig = _figure()
    ax_c, ax_s = fig.subplots(1, 2)
    title = "Multi-turn episodes: correct share and speedup by turn"
    fig.suptitle(title)
    names = [f"turn {t + 1}" for t in turns]
    xs = np.arange(len(turns))
    r = ax_c.bar(xs, share, 0.6, color="#2ca02c")
    ax_c.bar_label(r, labels=[f"{s:.1f}%\n(n={k})" for s, k in zip(share, n)], padding=2, fontsize=9)
    ax_c.set_xticks(xs, names)
    ax_c.set_ylim(0, 125)
    ax_c.set_yticks([0, 20, 40, 60, 80, 100])
    ax_c.set_title("Correct samples")
    ax_c.set_ylabel(SHARE_LABEL)
    ax_c.set_xlabel("turn of the episode")
    ax_c.grid(axis="x", visible=False)
    hv = [0.0 if math.isnan(m) else m for m in mean]
    r = ax_s.bar(xs, hv, 0.6, color="#1f77b4")
    ax_s.bar_label(r, labels=["none correct" if math.isnan(m) else f"{m:.2f}{TIMES}" for m in mean],
                   padding=2, fontsize=9)
    ax_s.set_xticks(xs, names)
    ax_s.set_ylim(0, max(hv + [1.0]) * 1.25)
    ax_s.yaxis.set_major_formatter(mticker.FuncFormatter(_times_formatter))
    ax_s.axhline(1.0, color="#888888", linewidth=0.9, linestyle=":", zorder=0.5)
    ax_s.set_title("Mean speedup of the correct samples")
    ax_s.set_ylabel(SPEEDUP_LABEL)
    ax_s.set_xlabel("turn of the episode")
    ax_s.grid(axis="x", visible=False)
    caption = (f"Every verdict record with a turn ({len(vs)}, all stages): for each turn of the episodes, the "
               "share of its samples that were correct and the mean speedup of those correct samples. A later "
               "turn sees the verdict on the earlier answers; episodes can end early, so later turns have fewer "
               "samples (n).")
    return Plot("turns", title, caption, fig)


@_styled
def plot_turns_steps(seg: Segment) -> Plot | None:
    """A sampling stage's train_step `turns`: correct share and mean speedup of each turn by step."""
    st = [s for s in seg.steps if s.turns]
    if len(st) < 2:
        return None
    turns = sorted({t[0] for s in st for t in s.turns})
    x = np.array([s.step for s in st], dtype=float)
    fig = _figure()
    ax_c, ax_s = fig.subplots(1, 2)
    title = f"{seg.label}: each turn of the episodes by step ({_steps_text(seg.first, seg.last)})"
    fig.suptitle(title)
    colours = STYLE["axes.prop_cycle"].by_key()["color"]
    means = [r[3] for s in st for r in s.turns if r[3] is not None]
    log = _wants_log(means)
    for i, t in enumerate(turns):
        rows = [next((r for r in s.turns if r[0] == t), None) for s in st]
        c = _arr(None if r is None or r[2] is None else 100 * r[2] for r in rows)
        m = _arr(None if r is None else r[3] for r in rows)
        _line(ax_c, x, c, f"turn {t + 1}", colours[i % len(colours)])
        _line(ax_s, x, m, f"turn {t + 1}", colours[i % len(colours)], geometric=log)
    ax_c.set_title("Correct samples")
    ax_c.set_ylabel(SHARE_LABEL)
    ax_c.set_ylim(-3, 103)
    ax_c.set_yticks([0, 20, 40, 60, 80, 100])
    _step_axis(ax_c, seg.first, seg.last, ticks=6)
    _legend_on_top(ax_c)
    ax_s.set_title("Mean speedup of the correct samples")
    _speedup_axis(ax_s, means)
    _step_axis(ax_s, seg.first, seg.last, ticks=6)
    _legend_on_top(ax_s)
    caption = (f"{seg.label} stage, from the train_step records' turns: for each turn of the episodes, the share "
               "of the step's samples at that turn that were correct and their mean speedup (no point where none "
               "was correct).")
    if len(x) > SMOOTH_FROM:
        caption += (f" Thin lines: each step; thick lines: the mean of {_smooth_window(len(x))} steps around "
                    "each step.")
    return Plot(f"{seg.id}_turns_steps", title, caption, fig)


@_styled
def plot_best_per_task(data: RunData) -> Plot | None:
    """Best speedup of each task, the warm start's seed variants apart from the samples."""
    vs = [v for v in data.verdicts if v.speedup is not None and not math.isnan(v.speedup)]
    if not vs:
        return None
    groups = ["seed variants (warm start)", "policy samples"]
    best: dict[str, list[float]] = defaultdict(lambda: [math.nan, math.nan])
    for v in vs:
        g = 0 if v.stage == "warm_start" else 1
        b = best[v.task]
        b[g] = v.speedup if math.isnan(b[g]) else max(b[g], v.speedup)
    used = [g for g in (0, 1) if any(not math.isnan(b[g]) for b in best.values())]
    ranked = sorted(best, key=lambda t: (-np.nanmax(best[t]), t))
    shown = ranked[:MAX_BAR_TASKS]
    n = len(shown)
    fig = _figure(height=max(HEIGHT, 1.3 + n * (0.22 if len(used) == 1 else 0.36)))
    ax = fig.add_subplot()
    title = "Best speedup per task"
    ax.set_title(title, fontsize=STYLE["figure.titlesize"])
    ys = np.arange(n)
    h = 0.7 / len(used)
    colours = {0: "#9ecae1", 1: "#1f77b4"}
    allv = [v for t in shown for v in best[t] if not math.isnan(v)]
    log = max(allv) / min(allv) > 10
    # On a log axis the bars start at its left edge (a log axis has no 0).
    base = min(allv) / 1.3 if log else 0.0
    for k, g in enumerate(used):
        off = (k - (len(used) - 1) / 2) * h
        vals = [best[t][g] for t in shown]
        r = ax.barh(ys + off, [0 if math.isnan(v) else v - base for v in vals], h, left=base, color=colours[g],
                    label=groups[g] if len(used) > 1 else None, edgecolor="#333333", linewidth=0.5)
        ax.bar_label(r, labels=["" if math.isnan(v) else f"{v:.2f}{TIMES}" for v in vals], padding=2, fontsize=9)
    ax.set_yticks(ys, [_short(t, 40) for t in shown])
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
        ax.set_xlim(base, max(allv) * 1.9)
        ax.xaxis.set_major_locator(mticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_minor_locator(mticker.NullLocator())
    else:
        ax.set_xlim(0, max(allv) * 1.2)
    ax.xaxis.set_major_formatter(mticker.FuncFormatter(_times_formatter))
    ax.axvline(1.0, color="#888888", linewidth=0.9, linestyle=":", zorder=0.5)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel(SPEEDUP_LABEL + (", log scale" if log else ""))
    ax.set_ylabel("task")
    if len(used) > 1:
        fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=2)
    caption = ("The fastest correct variant of each task: the highest speedup of a correct verdict record" +
               (", the warm start's seed variants and the policy's samples apart" if len(used) > 1 else "") +
               f"; tasks ordered by their best. {len(vs)} verdicts with a speedup.")
    if len(ranked) > n:
        caption += f" The {n} fastest of {len(ranked)} tasks are shown."
    hw = sorted({v.hardware for v in vs if v.hardware})
    if len(hw) == 1:
        caption += f" All were measured on {hw[0]}."
    last = next((r for r in reversed(data.lifecycle) if _is_number(r.get("best_speedup"))), None)
    if last is not None and _is_number(last.get("mean_speedup")):
        caption += (f" Run-wide at the last lifecycle record ({last.get('event')}, step {last.get('step')}): "
                    f"best {_fmt_x(float(last['best_speedup']))}, mean {_fmt_x(float(last['mean_speedup']))}.")
    return Plot("best_speedup_per_task", title, caption, fig)


@_styled
def plot_status(data: RunData) -> Plot | None:
    """Verdicts per status, split by stage."""
    if not data.verdicts:
        return None
    stages = list(OrderedDict.fromkeys(v.stage for v in data.verdicts))
    count = Counter((v.status, v.stage) for v in data.verdicts)
    total = Counter(v.status for v in data.verdicts)
    statuses = sorted(total, key=lambda s: (s != "ok", -total[s], s))
    fig = _figure(height=max(2.6, 1.6 + 0.42 * len(statuses)))
    ax = fig.add_subplot()
    title = "Verdicts by status"
    ax.set_title(title, fontsize=STYLE["figure.titlesize"])
    ys = np.arange(len(statuses))
    left = np.zeros(len(statuses))
    colours = STYLE["axes.prop_cycle"].by_key()["color"]
    for i, stg in enumerate(stages):
        vals = np.array([count[(s, stg)] for s in statuses], dtype=float)
        ax.barh(ys, vals, 0.6, left=left, color=colours[i % len(colours)], edgecolor="#333333", linewidth=0.5,
                label=STAGE_LABELS.get(stg, stg or "no stage") if len(stages) > 1 else None)
        left += vals
    n = len(data.verdicts)
    for y, s in zip(ys, statuses):
        ax.text(left[y] + n * 0.01, y, f"{total[s]} ({100 * total[s] / n:.1f}%)", va="center", fontsize=9)
    ax.set_yticks(ys, statuses)
    ax.invert_yaxis()
    ax.set_xlim(0, max(left) * 1.25)
    ax.xaxis.set_major_locator(mticker.MaxNLocator(integer=True))
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("verdicts (samples scored)")
    ax.set_ylabel("status")
    if len(stages) > 1:
        fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=min(len(stages), 4),
                   title="stage that drew the samples", title_fontsize=9)
    caption = (f"Every verdict record ({n}) by its status (ok: compiled, ran and was timed; the others say where "
               "a candidate failed), with the count and the share of all verdicts" +
               ("; the bars are split by the stage that drew the samples." if len(stages) > 1 else "."))
    return Plot("status", title, caption, fig)


@_styled
def plot_hardware(data: RunData) -> Plot | None:
    """Best speedup per hardware kind, where verdicts came from more than one."""
    best: dict[str, float] = {}
    for v in data.verdicts:
        if v.hardware and v.speedup is not None and not math.isnan(v.speedup):
            best[v.hardware] = max(best.get(v.hardware, v.speedup), v.speedup)
    if len(best) < 2:
        return None  # one kind: the best-per-task caption names it
    names = sorted(best)
    fig = _figure(height=max(3.0, 1.4 + 0.4 * len(names)))
    ax = fig.add_subplot()
    title = "Best speedup per hardware"
    ax.set_title(title, fontsize=STYLE["figure.titlesize"])
    ys = np.arange(len(names))
    r = ax.barh(ys, [best[k] for k in names], 0.6, color="#1f77b4")
    ax.bar_label(r, labels=[f"{best[k]:.2f}{TIMES}" for k in names], padding=2, fontsize=9)
    ax.set_yticks(ys, names)
    ax.invert_yaxis()
    ax.set_xlim(0, max(best.values()) * 1.2)
    ax.xaxis.set_major_formatter(mticker.FuncFormatter(_times_formatter))
    ax.grid(axis="y", visible=False)
    ax.set_xlabel(SPEEDUP_LABEL)
    ax.set_ylabel("hardware")
    caption = "The highest speedup of a correct verdict measured on each hardware kind (the verdicts' hardware)."
    return Plot("hardware", title, caption, fig)


@_styled
def plot_gpu_busy(data: RunData) -> Plot | None:
    """Each GPU's share of time held by evaluations and by the policy (the last lifecycle record
    with devices)."""
    if data.devices is None:
        return None
    rec, devs = data.devices
    names = [d["device"] for d in devs]
    secs = [float(d["seconds"]) for d in devs]

    def share(d: dict, key: str) -> float:
        v, s = d.get(key), float(d["seconds"])
        return 100.0 * float(v) / s if _is_number(v) and s > 0 else 0.0

    ev = [share(d, "evaluation_s") for d in devs]
    po = [share(d, "policy_s") for d in devs]
    fig = _figure(height=max(3.2, 1.5 + 0.65 * len(devs)))
    ax = fig.add_subplot()
    title = "GPU busy: each GPU's time held by evaluations and by the policy"
    ax.set_title(title, fontsize=STYLE["figure.titlesize"])
    ys = np.arange(len(devs))
    h = 0.36
    r1 = ax.barh(ys - h / 2, ev, h, color="#ff7f0e", label="evaluations", edgecolor="#333333", linewidth=0.5)
    r2 = ax.barh(ys + h / 2, po, h, color="#1f77b4", label="policy (generation and updates)", edgecolor="#333333",
                 linewidth=0.5)
    ax.bar_label(r1, labels=[f"{v:.1f}%" for v in ev], padding=2, fontsize=9)
    ax.bar_label(r2, labels=[f"{v:.1f}%" for v in po], padding=2, fontsize=9)
    ax.set_yticks(ys, [f"{n}\n({s:.0f} s)" for n, s in zip(names, secs)])
    ax.invert_yaxis()
    ax.set_xlim(0, 118)
    ax.set_xticks([0, 20, 40, 60, 80, 100])
    ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _p: f"{v:g}%"))
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("share of the GPU's time since the process began using it (%)")
    ax.set_ylabel("GPU (seconds in use)")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=2)
    caption = (f"For each GPU of the trainer's last process ({rec.get('event')} record at step {rec.get('step')}): "
               "the share of its seconds in use that evaluations held it and the share the policy's generation "
               "and updates held it (status.json's devices; docs/evaluator.md). The two are measured apart and "
               "can overlap; what neither holds is idle or waiting.")
    return Plot("gpu_busy", title, caption, fig)


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
    for fn in (plot_turns, plot_best_per_task, plot_status, plot_hardware, plot_gpu_busy):
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
