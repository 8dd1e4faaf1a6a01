# tools/report_plots.py: hand-made metrics.jsonl files -> the script (a subprocess: its manifest,
# PNG files, exit codes) and its plotting functions (imported: the matplotlib Figures they return,
# checked for titles, axis labels, legends and one x range per stage).
import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "report_plots.py"
TIMEOUT_S = 120
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load_module():
    spec = importlib.util.spec_from_file_location("report_plots", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["report_plots"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


rp = load_module()


# -- hand-made runs ---------------------------------------------------------------------------------

def lifecycle(event, step, stage, devices=None, best=None, mean=None, variants=0):
    rec = {"event": event, "time": "2026-11-28T11:40:00.000Z", "state": "running", "stage": stage, "step": step,
           "policy_version": step, "variants": variants, "best_speedup": best, "mean_speedup": mean}
    if devices is not None:
        rec["devices"] = devices
    return rec


def sft_step(step, loss):
    return {"event": "train_step", "stage": "sft", "step": step, "stage_step": step, "loss": loss, "grad_norm": 1.0,
            "lr": 1e-4, "tokens": 100, "sequences": 4, "skipped": False, "groups": 4}


def rl_step(step, stage_step, samples, correct, mean_speedup, best, loss=-0.1, turns=None):
    rec = {"event": "train_step", "stage": "rl", "step": step, "stage_step": stage_step, "loss": loss,
           "grad_norm": 0.5, "lr": 1e-4, "tokens": 200, "sequences": samples, "skipped": False, "groups": 2,
           "mean_reward": correct * (mean_speedup or 0.0), "samples": samples, "correct_share": correct,
           "format_error_share": 0.0 if correct == 1 else 0.125, "mean_speedup": mean_speedup,
           "best_speedup": best, "dropped_stale": 0}
    if turns is not None:
        rec["turns"] = turns
    return rec


def verdict(stage, step, task, correct, speedup=None, status=None, turn=None):
    rec = {"event": "verdict", "stage": stage, "step": step, "task": task,
           "status": status or ("ok" if correct else "incorrect"), "correct": correct,
           "speedup": speedup if correct else None, "reward": speedup or 0, "hardware": "h200",
           "policy_version": step, "group": 1, "cache_hit": False}
    if turn is not None:
        rec["turn"] = turn
    return rec


SFT_STEPS = range(1, 21)     # steps 1-20
RL_STEPS = range(21, 30)     # steps 21-29; their samples were drawn at steps 20-28
TASKS = ("level1/01_alpha_fp32", "level2/02_beta_fp32")


def sft_rl_records():
    recs = [lifecycle("run_started", 0, "warm_start")]
    for t in TASKS:
        recs.append(verdict("warm_start", 0, t, True, 2.0))
        recs.append(verdict("warm_start", 0, t, False))
    recs += [sft_step(s, 8.0 * 0.7 ** s) for s in SFT_STEPS]
    for k, step in enumerate(RL_STEPS):
        sampled = step - 1
        # task alpha improves (1.5x -> 3x), task beta stays at 20x; beta fails more early on
        a = 1.5 + 1.5 * k / (len(RL_STEPS) - 1)
        recs += [verdict("rl", sampled, TASKS[0], True, a) for _ in range(4)]
        recs += [verdict("rl", sampled, TASKS[1], i < 2 + k // 3, 20.0) for i in range(4)]
        correct = (4 + min(4, 2 + k // 3)) / 8
        recs.append(rl_step(step, k + 1, 8, correct, a, 20.0))
    recs.append(lifecycle("run_finished", RL_STEPS[-1], "", best=20.0, mean=6.5, variants=80))
    return recs


def write_run(tmp_path, records, name="run", tail=""):
    run = tmp_path / name
    run.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in records) + tail
    (run / "metrics.jsonl").write_text(text)
    return run


def call(run, out):
    return subprocess.run([sys.executable, "-B", str(SCRIPT), str(run), str(out)], capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def plots_of(records, tmp_path):
    run = write_run(tmp_path, records, name="plots")
    data = rp.collect(rp.read_records(run / "metrics.jsonl"), "metrics.jsonl")
    return {p.id: p for p in rp.make_plots(data)}


# -- figure checks ----------------------------------------------------------------------------------

def labelled(ax):
    """The labelled series of an axes: lines and bar containers whose label is not '_...'."""
    names = [a.get_label() for a in list(ax.get_lines()) + list(ax.containers)]
    return [n for n in names if n and not n.startswith("_")]


def check_readable(plot):
    fig = plot.figure
    axes = fig.get_axes()
    assert axes, plot.id
    assert plot.title and plot.caption, plot.id
    w, h = fig.get_size_inches()
    assert 7.5 <= w <= 8.5 and 2.5 <= h <= 12, (plot.id, w, h)
    for ax in axes:
        assert ax.get_title(), (plot.id, "axes without a title")
        assert ax.get_xlabel(), (plot.id, ax.get_title(), "no x label")
        assert ax.get_ylabel(), (plot.id, ax.get_title(), "no y label")
        if len(labelled(ax)) > 1:
            assert ax.get_legend() is not None or fig.legends, (plot.id, ax.get_title(), "no legend")
        for t in [ax.title, ax.xaxis.label, ax.yaxis.label] + ax.get_xticklabels() + ax.get_yticklabels():
            assert t.get_fontsize() >= 9, (plot.id, t.get_text(), t.get_fontsize())


def x_data(ax):
    xs = []
    for line in ax.get_lines():
        if line.get_transform() is not ax.transData:
            continue  # axhline (spans the axes) or a marker at the axes' bottom edge
        xs += [float(x) for x in line.get_xdata()]
    return xs


# -- tests ------------------------------------------------------------------------------------------

def test_manifest_and_pngs(tmp_path):
    run = write_run(tmp_path, sft_rl_records())
    out = tmp_path / "out" / "plots"  # created, parents too
    r = call(run, out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.isascii()
    manifest = json.loads(r.stdout)
    assert list(manifest) == ["plots"]
    ids = [p["id"] for p in manifest["plots"]]
    assert ids == ["sft_loss", "rl_steps", "rl_learning", "rl_tasks_correct", "rl_tasks_speedup",
                   "best_speedup_per_task", "status"]
    for p in manifest["plots"]:
        assert sorted(p) == ["caption", "file", "id", "title"]
        assert p["file"] == p["id"] + ".png"
        assert p["title"] and p["caption"]
        w, h = png_size(out / p["file"])
        assert w == 880 and 250 <= h <= 1300, (p["id"], w, h)
    assert sorted(f.name for f in out.iterdir()) == sorted(p["file"] for p in manifest["plots"])
    by_id = {p["id"]: p for p in manifest["plots"]}
    assert "nats per token" in by_id["sft_loss"]["caption"]
    assert "All 2 sampled tasks" in by_id["rl_tasks_correct"]["caption"]


def test_same_input_same_bytes(tmp_path):
    run = write_run(tmp_path, sft_rl_records())
    a, b = tmp_path / "a", tmp_path / "b"
    assert call(run, a).returncode == 0
    assert call(run, b).returncode == 0
    for f in a.iterdir():
        assert f.read_bytes() == (b / f.name).read_bytes(), f.name


def test_every_figure_readable(tmp_path):
    plots = plots_of(sft_rl_records(), tmp_path)
    for p in plots.values():
        check_readable(p)


def test_stages_on_their_own_axes(tmp_path):
    plots = plots_of(sft_rl_records(), tmp_path)
    sft_first, sft_last, rl_first, rl_last = SFT_STEPS[0], SFT_STEPS[-1], RL_STEPS[0], RL_STEPS[-1]
    (sft_ax,) = plots["sft_loss"].figure.get_axes()
    lo, hi = sft_ax.get_xlim()
    assert sft_first - 0.5 <= lo <= sft_first and sft_last <= hi <= sft_last + 0.5
    assert all(sft_first <= x <= sft_last for x in x_data(sft_ax))
    assert "nats/token" in sft_ax.get_ylabel()
    rl_axes = plots["rl_steps"].figure.get_axes()
    assert len(rl_axes) == 4
    for ax in rl_axes:
        lo, hi = ax.get_xlim()
        assert rl_first - 0.5 <= lo <= rl_first and rl_last <= hi <= rl_last + 0.5, ax.get_title()
        assert lo > sft_last, "the RL axis reaches into SFT's steps"
        assert all(rl_first <= x <= rl_last for x in x_data(ax)), ax.get_title()
        assert ax.get_xlabel() == "step"
    assert not set(map(id, rl_axes)) & {id(sft_ax)}
    ylabels = {ax.get_title(): ax.get_ylabel() for ax in rl_axes}
    assert ylabels["Correct samples"] == "share of samples (%)"
    assert ylabels["Speedup"] == "speedup (\u00d7, candidate over reference)"
    speed = next(ax for ax in rl_axes if ax.get_title() == "Speedup")
    assert sorted(labelled(speed)) == ["mean of correct samples", "run's best so far"]
    assert speed.get_legend() is not None
    # per-task panels: the verdicts' steps (the policy that sampled), steps 20-28
    for key in ("rl_tasks_correct", "rl_tasks_speedup"):
        axes = plots[key].figure.get_axes()
        assert sorted(ax.get_title() for ax in axes) == sorted(TASKS)
        for ax in axes:
            lo, hi = ax.get_xlim()
            assert RL_STEPS[0] - 1.5 <= lo and hi <= RL_STEPS[-1] - 0.5
            assert all(RL_STEPS[0] - 1 <= x <= RL_STEPS[-1] - 1 for x in x_data(ax))


def test_learning_summary(tmp_path):
    run = write_run(tmp_path, sft_rl_records())
    data = rp.collect(rp.read_records(run / "metrics.jsonl"))
    p = rp.learning_progress(data, "rl")
    assert (p.steps, p.window, p.first_steps, p.last_steps) == (9, 3, (21, 23), (27, 29))
    # pooled: steps 21-23 have 6 of 8 correct, 27-29 have 8 of 8
    assert p.first_correct == pytest.approx(18 / 24) and p.last_correct == pytest.approx(1.0)
    assert p.tasks == 2 and p.speedup_tasks == 2
    assert p.first_task_correct == pytest.approx((1.0 + 0.5) / 2)
    assert p.last_task_correct == pytest.approx(1.0)
    fig = rp.make_plots(data)[2].figure
    assert [ax.get_title() for ax in fig.get_axes()] == ["Correct samples", "Mean speedup of the correct samples"]
    assert fig.legends  # first and last third, once under both panels


def test_many_tasks_are_capped(tmp_path):
    recs = [sft_step(1, 2.0)]
    tasks = [f"level1/{i:02d}_task_with_a_rather_long_name_fp32" for i in range(15)]
    for k, step in enumerate(range(2, 6)):
        for i, t in enumerate(tasks):
            recs += [verdict("rl", step - 1, t, True, 1.0 + i) for _ in range(1 + (i < 12))]
        recs.append(rl_step(step, k + 1, 27, 1.0, 5.0, 15.0))
    plots = plots_of(recs, tmp_path)
    p = plots["rl_tasks_correct"]
    assert len(p.figure.get_axes()) == 12
    assert "The 12 most sampled of 15 tasks are shown" in p.caption
    check_readable(p)
    # titles shortened to their panels' width keep the start of the name
    for ax in p.figure.get_axes():
        assert ax.get_title().startswith("level1/")


def test_multi_turn(tmp_path):
    recs = [lifecycle("run_started", 0, "rl")]
    for k, step in enumerate(range(1, 5)):
        for i in range(4):
            recs.append(verdict("rl", step - 1, TASKS[0], i < 2, 2.0, turn=0))
            recs.append(verdict("rl", step - 1, TASKS[0], i < 3, 3.0, turn=1))
        turns = [{"turn": 0, "samples": 4, "correct_share": 0.5, "mean_speedup": 2.0},
                 {"turn": 1, "samples": 4, "correct_share": 0.75, "mean_speedup": 3.0}]
        recs.append(rl_step(step, k + 1, 8, 0.625, 2.6, 3.0, turns=turns))
    run = write_run(tmp_path, recs)
    r = call(run, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    ids = [p["id"] for p in json.loads(r.stdout)["plots"]]
    assert "turns" in ids and "rl_turns_steps" in ids
    plots = plots_of(recs, tmp_path)
    turns = plots["turns"]
    check_readable(turns)
    ax_c, ax_s = turns.figure.get_axes()
    heights = [b.get_height() for b in ax_c.containers[0]]
    assert heights == pytest.approx([50.0, 75.0])
    assert [t.get_text() for t in ax_c.get_xticklabels()] == ["turn 1", "turn 2"]
    assert [b.get_height() for b in ax_s.containers[0]] == pytest.approx([2.0, 3.0])
    steps = plots["rl_turns_steps"]
    check_readable(steps)
    for ax in steps.figure.get_axes():
        assert sorted(labelled(ax)) == ["turn 1", "turn 2"]
        assert ax.get_xlim()[0] >= 0.5


def test_gpu_busy_uses_last_record(tmp_path):
    early = [{"device": "cuda:0", "seconds": 10.0, "evaluation_s": 1.0, "policy_s": 1.0}]
    late = [{"device": "cuda:0", "seconds": 100.0, "evaluation_s": 50.0, "policy_s": 25.0, "evaluator": True},
            {"device": "cuda:1", "seconds": 80.0, "evaluation_s": 60.0, "policy_s": 0}]
    recs = [lifecycle("run_started", 0, "sft"), sft_step(1, 1.0), sft_step(2, 0.5),
            lifecycle("run_paused", 2, "sft", devices=early), lifecycle("run_resumed", 2, "sft"),
            lifecycle("run_finished", 2, "", devices=late), lifecycle("run_stopped", 2, "")]
    run = write_run(tmp_path, recs)
    r = call(run, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert [p["id"] for p in json.loads(r.stdout)["plots"]] == ["sft_loss", "gpu_busy"]
    p = plots_of(recs, tmp_path)["gpu_busy"]
    check_readable(p)
    (ax,) = p.figure.get_axes()
    ev, po = ax.containers
    assert [b.get_width() for b in ev] == pytest.approx([50.0, 75.0])
    assert [b.get_width() for b in po] == pytest.approx([25.0, 0.0])
    assert [t.get_text().split("\n")[0] for t in ax.get_yticklabels()] == ["cuda:0", "cuda:1"]
    assert ax.get_xlim()[0] == 0 and "run_finished" in p.caption


def test_empty_run(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    out = tmp_path / "out"
    r = call(run, out)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"plots": []}
    assert not out.exists() or not any(out.iterdir())


def test_lifecycle_only_has_no_plots(tmp_path):
    run = write_run(tmp_path, [lifecycle("run_started", 0, "warm_start")])
    r = call(run, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"plots": []}


def test_torn_last_line_is_left_out(tmp_path):
    run = write_run(tmp_path, [sft_step(1, 2.0), sft_step(2, 1.0)], tail='{"event":"train_step","st')
    r = call(run, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert [p["id"] for p in json.loads(r.stdout)["plots"]] == ["sft_loss"]


@pytest.mark.parametrize("line, message", [
    ("not json", "metrics.jsonl:2: not JSON"),
    ("[1, 2]", "metrics.jsonl:2: expected a JSON object, got array"),
    ('{"step": 3}', "metrics.jsonl:2: record has no 'event' or 'kind' key"),
    ('{"event": "train_step", "step": 2, "mean_reward": true}',
     "metrics.jsonl:2: key 'mean_reward': expected a number or null, got boolean"),
    ('{"event": "train_step", "step": -1}', "metrics.jsonl:2: key 'step': expected a non-negative integer"),
    ('{"event": "verdict", "status": "ok"}', "metrics.jsonl:2: key 'task': missing"),
])
def test_bad_line(tmp_path, line, message):
    run = tmp_path / "bad"
    run.mkdir()
    good = json.dumps(sft_step(1, 1.0))
    (run / "metrics.jsonl").write_text(good + "\n" + line + "\n" + good + "\n")
    out = tmp_path / "out"
    r = call(run, out)
    assert r.returncode == 2
    assert message in r.stderr, r.stderr
    assert r.stdout == ""
    assert not out.exists()


def test_not_a_directory(tmp_path):
    r = call(tmp_path / "missing", tmp_path / "out")
    assert r.returncode == 2 and "not a directory" in r.stderr
    r = subprocess.run([sys.executable, "-B", str(SCRIPT)], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 2 and "usage" in r.stderr


def test_limit_per_task(tmp_path):
    # Verdicts with fractions of the hardware's limit (evaluator.limits): the figure shows each
    # task's best and median candidate fraction beside the reference's, and counts those above 1.0.
    recs = sft_rl_records()
    plots = plots_of(recs, tmp_path)
    assert "limit" not in plots  # no verdict carries a bound
    with_bound = []
    for r in recs:
        if r.get("event") == "verdict" and r["correct"]:
            fast = r["task"] == TASKS[1]
            r = dict(r, bound_ms=0.5, fraction=1.2 if fast else 0.1 * r["speedup"], ref_fraction=0.06 if fast else 0.05,
                     fraction_of="ms" if fast else "bytes_ms")
        with_bound.append(r)
    run = write_run(tmp_path, with_bound, name="bound")
    r = call(run, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    ids = [p["id"] for p in json.loads(r.stdout)["plots"]]
    assert ids.index("limit") == ids.index("best_speedup_per_task") + 1
    (tmp_path / "again").mkdir()
    plots = plots_of(with_bound, tmp_path / "again")
    p = plots["limit"]
    check_readable(p)
    ax = p.figure.get_axes()[0]
    best, median, ref = (list(c.datavalues) for c in ax.containers)
    assert [t.get_text() for t in ax.get_yticklabels()] == [TASKS[1], TASKS[0]]  # ordered by their best
    assert best == pytest.approx([1.2, 0.3])  # alpha's best: 3x at 0.1 a unit
    assert median[0] == pytest.approx(1.2) and 0.15 < median[1] < 0.3
    assert ref == pytest.approx([0.06, 0.05])
    n_above = sum(1 for v in with_bound if v.get("event") == "verdict" and (v.get("fraction") or 0) > 1.0)
    assert f"{n_above} above 1.0" in p.caption
    # alpha's best beat the FLOP part: marked, and the caption says what that means
    labels = [t.get_text() for t in ax.texts]
    assert "0.30 (bytes)" in labels and "1.20" in labels
    assert "(bytes) beat the bound's FLOP part" in p.caption
