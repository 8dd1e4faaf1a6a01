"""tools/report_run_plots.py: a run's data (report_records.py) -> the run-wide figures, drawn with
report_draw.py's helpers: multi-turn episodes by turn, best speedup per task, how far each task's
kernels are from the hardware's limit, verdicts by status, best speedup per hardware, GPU busy."""
from __future__ import annotations

import math
import statistics
from collections import Counter, OrderedDict, defaultdict

import matplotlib.ticker as mticker
import numpy as np

from report_draw import (HEIGHT, MAX_BAR_TASKS, SHARE_LABEL, SPEEDUP_LABEL, STYLE, TIMES, Plot, _figure, _fmt_x,
                         _short, _styled, _times_formatter)
from report_records import STAGE_LABELS, RunData, _is_number


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
def plot_limit(data: RunData) -> Plot | None:
    """Each task's correct verdicts as fractions of the hardware's limit (the verdicts' `fraction`,
    evaluator.limits): the best and the median, beside the reference's median."""
    vs = [v for v in data.verdicts if v.correct and v.status == "ok" and v.fraction is not None
          and math.isfinite(v.fraction) and v.fraction > 0]
    if not vs:
        return None
    by: dict[str, list[float]] = defaultdict(list)
    ref: dict[str, list[float]] = defaultdict(list)
    best: dict[str, tuple[float, bool]] = {}  # the task's best fraction, and whether it is of the bytes part
    for v in vs:
        if v.task not in best or v.fraction > best[v.task][0]:
            best[v.task] = (v.fraction, v.of_bytes)
        by[v.task].append(v.fraction)
        if v.ref_fraction is not None and math.isfinite(v.ref_fraction) and v.ref_fraction > 0:
            ref[v.task].append(v.ref_fraction)
    ranked = sorted(by, key=lambda t: (-best[t][0], t))
    shown = ranked[:MAX_BAR_TASKS]
    n = len(shown)
    rows = [("best of the correct verdicts", "#1f77b4", [best[t][0] for t in shown]),
            ("median of the correct verdicts", "#9ecae1", [statistics.median(by[t]) for t in shown]),
            ("the reference (median)", "#bdbdbd", [statistics.median(ref[t]) if ref[t] else math.nan for t in shown])]
    fig = _figure(height=max(HEIGHT, 1.5 + n * 0.5))
    ax = fig.add_subplot()
    title = "How far from the hardware's limit, per task"
    ax.set_title(title, fontsize=STYLE["figure.titlesize"])
    ys = np.arange(n)
    h = 0.8 / len(rows)
    for k, (label, colour, vals) in enumerate(rows):
        r = ax.barh(ys + (k - 1) * h, [0 if math.isnan(x) else x for x in vals], h, color=colour, label=label,
                    edgecolor="#333333", linewidth=0.5)
        mark = [k == 0 and best[t][1] for t in shown]
        ax.bar_label(r, labels=["" if math.isnan(x) else f"{x:.2f}" + (" (bytes)" if m else "") for x, m in zip(vals, mark)],
                     padding=2, fontsize=9)
    ax.set_yticks(ys, [_short(t, 40) for t in shown])
    ax.invert_yaxis()
    top = max(x for _, _, vals in rows for x in vals if not math.isnan(x))
    ax.set_xlim(0, max(1.1, top * 1.15))
    ax.axvline(1.0, color="#888888", linewidth=0.9, linestyle=":", zorder=0.5)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("fraction of the limit (the task's bound / the call's median time; 1.0 is at the limit)")
    ax.set_ylabel("task")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=3)
    above = sum(1 for v in vs if v.fraction > 1.0)
    caption = ("Each task's correct verdicts as fractions of its bound on the verdict's hardware (the verdict "
               "records' `fraction` and `ref_fraction`; docs/evaluator.md, How far from the limit): the best and "
               "the median of the candidates, and the reference's median; tasks ordered by their best. "
               f"{len(vs)} correct verdicts with a bound" +
               (f"; {above} above 1.0, faster than the bound allows: worth a look" if above else "") + ". " +
               ("A best marked (bytes) beat the bound's FLOP part, which counts the reference's algorithm, and is "
                "measured against its bytes part alone: it may sit below its reference's fraction of the whole "
                "bound while being many times faster." if any(best[t][1] for t in shown) else ""))
    return Plot("limit", title, caption, fig)


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
