"""tools/report_stage_plots.py: a run's data (report_records.py) -> the figures of each stage's
steps, drawn with report_draw.py's helpers: a stage without samples' loss; a sampling stage's samples
and updates, its learning summary, its per-task panels and each turn of its episodes by step."""
from __future__ import annotations

import math
import re
import statistics
from collections import Counter, OrderedDict
from typing import Any, Callable

import matplotlib.ticker as mticker
import numpy as np
from matplotlib.figure import Figure

from report_draw import (MAX_POINTS, MAX_TASK_PANELS, NATS_LABEL, SHARE_LABEL, SMOOTH_FROM, SPEEDUP_LABEL,
                         STYLE, TIMES, Plot, _arr, _count, _figure, _fmt_x, _legend, _legend_on_top, _line, _pct,
                         _short, _smooth_window, _speedup_axis, _step_axis, _steps_text, _styled, _times_formatter,
                         _wants_log)
from report_records import Progress, RunData, Segment, Verdict, _is_number, stage_verdicts


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
