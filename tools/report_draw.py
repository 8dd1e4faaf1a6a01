"""tools/report_draw.py: the fixed style and the drawing helpers of tools/report_plots.py's
figures (report_stage_plots.py, report_run_plots.py): figures, step and speedup axes, lines with a
moving mean, legends, number formats."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.ticker as mticker  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

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

SPEEDUP_LABEL = "speedup (\u00d7, candidate over reference)"
SHARE_LABEL = "share of samples (%)"
NATS_LABEL = "loss (nats/token)"
TIMES = "\u00d7"


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
