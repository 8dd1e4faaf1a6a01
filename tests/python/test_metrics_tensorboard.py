# tools/metrics_tensorboard.py: a hand-made run directory -> the script (a subprocess) -> its event
# files read back with TensorBoard's own EventAccumulator. Values are exact in float32 (TensorBoard
# keeps a scalar as a float32), so they are compared with ==.
import datetime
import json
import os
import selectors
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

with warnings.catch_warnings():  # the text plugin's vendored bleach warns about html5lib on import
    warnings.simplefilter("ignore", DeprecationWarning)
    from tensorboard.plugins.text import text_plugin

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "metrics_tensorboard.py"
TIMEOUT_S = 60

CONFIG = """run:
  name: "t1"
  seed: 7
model:
  note: "a `tick` and ``` three"
"""


def t(second):
    return f"2026-11-28T11:40:{second:02d}.250Z"


def epoch(second):
    return datetime.datetime(2026, 11, 28, 11, 40, second, 250000, tzinfo=datetime.timezone.utc).timestamp()


def line(**record):
    return json.dumps(record) + "\n"


def sft_step(step, loss, second):
    return line(event="train_step", time=t(second), stage="sft", step=step, stage_step=step, policy_version=step,
                loss=loss, grad_norm=0.5, lr=0.0001220703125, tokens=300, sequences=8, zero_advantage=0,
                seconds=0.25, publish_seconds=0.125, step_seconds=0.5, wait_seconds=0, prep_seconds=0.0625,
                skipped=False, groups=8)


def step_timing(step, rt, second):
    return line(event="step_timing", time=t(second), step=step, round_trip_seconds=rt)


BASE = [
    line(event="run_started", time=t(0), state="running", stage="warm_start", step=0, policy_version=0,
         variants=0, best_speedup=None, mean_speedup=None),
    line(event="verdict", time=t(1), stage="warm_start", step=0, task="level1/a", status="ok", correct=True,
         speedup=1.5, reward=1.5, hardware="h200", policy_version=0, group=0, cache_hit=False),
    line(event="verdict", time=t(2), stage="warm_start", step=0, task="level1/b", status="incorrect",
         correct=False, speedup=None, reward=0, hardware="h200", policy_version=0, group=0, cache_hit=True),
    sft_step(1, 2.5, 3),
    step_timing(1, 0.75, 3),
    sft_step(2, 1.25, 4),
    step_timing(2, 0.625, 4),
    line(event="checkpoint", time=t(5), step=2, dir="/runs/t1/checkpoints/step-2", seconds=0.5, bytes=1024),
]

RL = [
    line(event="train_step", time=t(10), stage="rl", step=3, stage_step=1, policy_version=3, loss=-0.125,
         grad_norm=0.25, lr=0.0001220703125, tokens=500, sequences=16, zero_advantage=8, seconds=0.5,
         publish_seconds=0.125, step_seconds=4.0, wait_seconds=3.25, prep_seconds=0, skipped=True, groups=2,
         mean_reward=1.5, samples=4, correct_share=0.75, format_error_share=0.25, mean_speedup=2.0,
         best_speedup=3.0, dropped_stale=1,
         turns=[{"turn": 0, "samples": 2, "correct_share": 0.5, "mean_speedup": 1.5},
                {"turn": 1, "samples": 2, "correct_share": 1, "mean_speedup": 2.5}]),
    line(event="verdict", time=t(11), stage="rl", step=3, task="level1/a", status="ok", correct=True,
         speedup=3, reward=3.0, hardware="h200", policy_version=2, group=4, cache_hit=False, turn=1),
    "this is not json\n",
    line(event="probe", time=t(12), value=7),  # no step, no stage: "run", at the last step seen (3)
    line(event="run_finished", time=t(13), state="finished", stage="", step=3, policy_version=3, variants=3,
         best_speedup=3.0, mean_speedup=2.25, unfinished=0,
         devices=[{"device": "cuda:0", "seconds": 100.0, "evaluation_s": 25.0, "policy_s": 50.0, "evaluator": True},
                  {"device": "cuda:1", "seconds": 8, "evaluation_s": 2, "policy_s": 0, "evaluator": True}]),
]
TORN = '{"event":"train_step","time":"' + t(14) + '","stage":"rl","step":4,"loss":9.5,"grad'


def make_run(tmp_path, lines, torn=TORN):
    run = tmp_path / "run1"
    run.mkdir()
    (run / "config.yaml").write_text(CONFIG)
    (run / "metrics.jsonl").write_text("".join(lines) + torn)
    return run


def convert(run, *args):
    return subprocess.run([sys.executable, "-B", str(SCRIPT), str(run), *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def read_events(out):
    """{stage: EventAccumulator} of every stage folder of out."""
    stages = {}
    for d in sorted(out.iterdir()):
        if d.is_dir():
            ea = EventAccumulator(str(d), size_guidance={"scalars": 0, "tensors": 0})
            ea.Reload()
            stages[d.name] = ea
    return stages


def series(ea, tag):
    return [(s.step, s.value) for s in ea.Scalars(tag)]


def tags(ea):
    return set(ea.Tags()["scalars"])


def test_stages_tags_values_config_and_torn_line(tmp_path):
    run = make_run(tmp_path, BASE + RL)
    r = convert(run)
    assert r.returncode == 0, r.stderr
    metrics = run / "metrics.jsonl"
    # The bad line is named once, by file and line; the torn last line is not a warning.
    assert r.stderr.count("warning") == 1, r.stderr
    assert f"{metrics}:11: not a JSON object" in r.stderr
    out = run / "tensorboard"
    assert (out / ".metrics_tensorboard").is_file()
    ev = read_events(out)
    assert set(ev) == {"warm_start", "sft", "rl", "run"}
    for ea in ev.values():
        assert len(os.listdir(ea.path)) == 1

    ws, sft, rl, runs = ev["warm_start"], ev["sft"], ev["rl"], ev["run"]
    # Booleans of the top level as 0/1, nulls and strings left out, "step" not repeated.
    assert series(ws, "verdict/correct") == [(0, 1.0), (0, 0.0)]
    assert series(ws, "verdict/cache_hit") == [(0, 0.0), (0, 1.0)]
    assert series(ws, "verdict/speedup") == [(0, 1.5)]
    assert series(ws, "run_started/variants") == [(0, 0.0)]
    assert "run_started/best_speedup" not in tags(ws)
    for ea in ev.values():
        assert not any(x.endswith(("/step", "/time", "/stage", "/status", "/task", "/hardware", "/dir", "/state"))
                       for x in tags(ea)), tags(ea)
    assert [s.wall_time for s in ws.Scalars("verdict/correct")] == pytest.approx([epoch(1), epoch(2)], abs=1e-6)

    assert series(sft, "train_step/loss") == [(1, 2.5), (2, 1.25)]
    assert series(sft, "train_step/prep_seconds") == [(1, 0.0625), (2, 0.0625)]
    assert series(sft, "train_step/skipped") == [(1, 0.0), (2, 0.0)]
    assert series(sft, "train_step/lr") == [(1, 0.0001220703125), (2, 0.0001220703125)]
    assert "train_step/correct_share" not in tags(sft)

    # RL: the step's tally, the turns flattened by turn, the verdict's turn. The torn step 4 is absent.
    assert series(rl, "train_step/loss") == [(3, -0.125)]
    assert series(rl, "train_step/correct_share") == [(3, 0.75)]
    assert series(rl, "train_step/skipped") == [(3, 1.0)]
    assert series(rl, "train_step/turns/0/correct_share") == [(3, 0.5)]
    assert series(rl, "train_step/turns/1/correct_share") == [(3, 1.0)]
    assert series(rl, "train_step/turns/1/mean_speedup") == [(3, 2.5)]
    assert series(rl, "train_step/turns/0/samples") == [(3, 2.0)]
    assert series(rl, "verdict/speedup") == [(3, 3.0)]
    assert series(rl, "verdict/turn") == [(3, 1.0)]
    for ea in ev.values():
        for tag in tags(ea):
            assert all(s.step <= 3 for s in ea.Scalars(tag)), tag
    assert 9.5 not in [v for _, v in series(rl, "train_step/loss")]

    # Records without a stage (or with an empty one) in "run"; one without a step at the last step.
    assert series(runs, "step_timing/round_trip_seconds") == [(1, 0.75), (2, 0.625)]
    assert series(runs, "checkpoint/seconds") == [(2, 0.5)]
    assert series(runs, "checkpoint/bytes") == [(2, 1024.0)]
    assert series(runs, "probe/value") == [(3, 7.0)]
    assert series(runs, "run_finished/mean_speedup") == [(3, 2.25)]
    assert series(runs, "devices/cuda:0/evaluation_share") == [(3, 0.25)]
    assert series(runs, "devices/cuda:0/policy_share") == [(3, 0.5)]
    assert series(runs, "devices/cuda:0/seconds") == [(3, 100.0)]
    assert series(runs, "devices/cuda:1/evaluation_share") == [(3, 0.25)]
    assert series(runs, "devices/cuda:1/policy_share") == [(3, 0.0)]
    assert not any("evaluator" in x for x in tags(runs))
    assert not any(x.startswith("devices/") for x in tags(sft) | tags(rl) | tags(ws))

    # The config: text at step 0 in "run", a code block that TensorBoard's text plugin renders as such.
    assert runs.Tags()["tensors"] == ["config"]
    (cfg,) = runs.Tensors("config")
    assert cfg.step == 0
    text = cfg.tensor_proto.string_val[0].decode()
    assert CONFIG in text and text.startswith("````yaml\n") and text.endswith("\n````\n")
    html = text_plugin.text_array_to_html(tensor_util.make_ndarray(cfg.tensor_proto), True)
    assert html.startswith("<pre><code") and "seed: 7" in html and "``` three" in html
    for stage in ("warm_start", "sft", "rl"):
        assert ev[stage].Tags()["tensors"] == []


def test_rewrite_after_resume_cut_shows_each_step_once(tmp_path):
    run = make_run(tmp_path, BASE + RL)
    assert convert(run).returncode == 0
    # A crash in RL, and a resume from a checkpoint after step 1: crucible cuts the file back to the
    # length that checkpoint noted (step 1's records), and the resumed run does steps 2 and 3 again
    # with other values.
    metrics = run / "metrics.jsonl"
    metrics.write_text("".join(BASE[:5] + [sft_step(2, 0.75, 20), step_timing(2, 0.5, 20),
                                           sft_step(3, 0.5, 21), step_timing(3, 0.25, 21)]))
    r = convert(run)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    ev = read_events(run / "tensorboard")
    assert set(ev) == {"warm_start", "sft", "run"}  # rl was only in the crashed part: its folder is gone
    assert series(ev["sft"], "train_step/loss") == [(1, 2.5), (2, 0.75), (3, 0.5)]
    assert series(ev["run"], "step_timing/round_trip_seconds") == [(1, 0.75), (2, 0.5), (3, 0.25)]
    assert [s.wall_time for s in ev["sft"].Scalars("train_step/loss")] == pytest.approx(
        [epoch(3), epoch(20), epoch(21)], abs=1e-6)
    assert "checkpoint/seconds" not in tags(ev["run"])
    for ea in ev.values():
        assert len(os.listdir(ea.path)) == 1
        assert ea.Tags()["tensors"] == (["config"] if ea.path.endswith("/run") else [])


def wait_for_output(proc, needle, timeout_s):
    """stdout of proc until it holds needle (the script says so after its first pass)."""
    got = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while needle not in got:
            left = deadline - time.monotonic()
            assert left > 0 and proc.poll() is None, f"no {needle!r} from the script: {got!r}"
            if sel.select(left):
                chunk = os.read(proc.stdout.fileno(), 4096)
                assert chunk, f"the script closed stdout: {got!r}"
                got += chunk
    return got


@pytest.fixture
def child():
    """A process the test ends, for --follow to watch."""
    p = subprocess.Popen(["sleep", "600"])
    yield p
    p.kill()
    p.wait()


def follow(run, pid):
    return subprocess.Popen([sys.executable, "-B", str(SCRIPT), str(run), "--follow", str(pid), "--poll-s", "0.05"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def end(child, proc):
    child.kill()
    child.wait()
    out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0, err.decode()
    return out.decode(), err.decode()


def test_follow_reads_appends_until_the_process_ends(tmp_path, child):
    run = make_run(tmp_path, BASE, torn="")
    proc = follow(run, child.pid)
    try:
        wait_for_output(proc, b"following pid", TIMEOUT_S)
        # Appended after the first pass: whole records, then one in two writes (torn, then completed),
        # then a torn line that is never completed.
        step3 = RL[0]
        with open(run / "metrics.jsonl", "a") as f:
            f.write(sft_step(3, 0.5, 21) + step3[:40])
            f.flush()
            f.write(step3[40:] + RL[1] + TORN)
        out, err = end(child, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert err == ""
    assert "records of" in out.splitlines()[-1]
    ev = read_events(run / "tensorboard")
    assert series(ev["sft"], "train_step/loss") == [(1, 2.5), (2, 1.25), (3, 0.5)]
    assert series(ev["rl"], "train_step/loss") == [(3, -0.125)]
    assert series(ev["rl"], "train_step/turns/1/mean_speedup") == [(3, 2.5)]
    assert series(ev["rl"], "verdict/speedup") == [(3, 3.0)]
    assert ev["run"].Tags()["tensors"] == ["config"]


def test_follow_starts_over_when_the_file_is_cut(tmp_path, child):
    run = make_run(tmp_path, BASE, torn="")
    proc = follow(run, child.pid)
    try:
        wait_for_output(proc, b"following pid", TIMEOUT_S)
        # A resume cuts the file back to step 1 and does step 2 again (a line of the same length as
        # the old one, so only the content tells), then step 3.
        metrics = run / "metrics.jsonl"
        old = metrics.read_bytes()
        new = "".join(BASE[:5] + [sft_step(2, 0.75, 20), step_timing(2, 0.5, 20), sft_step(3, 0.5, 21)])
        with open(metrics, "r+") as f:
            f.truncate(len("".join(BASE[:5])))
            f.seek(0, os.SEEK_END)
            f.write(new[len("".join(BASE[:5])):])
        assert len(new) > len(old)  # the size alone would not tell
        out, err = end(child, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert err.count("was cut back") == 1, err
    ev = read_events(run / "tensorboard")
    assert series(ev["sft"], "train_step/loss") == [(1, 2.5), (2, 0.75), (3, 0.5)]
    assert series(ev["run"], "step_timing/round_trip_seconds") == [(1, 0.75), (2, 0.5)]
    assert "checkpoint/seconds" not in tags(ev["run"])
    assert ev["run"].Tags()["tensors"] == ["config"]
    for ea in ev.values():
        assert len(os.listdir(ea.path)) == 1


def test_follow_of_a_process_already_gone_is_one_pass(tmp_path):
    run = make_run(tmp_path, BASE)
    gone = subprocess.Popen(["true"])
    gone.wait()
    r = subprocess.run([sys.executable, "-B", str(SCRIPT), str(run), "--follow", str(gone.pid)],
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert series(read_events(run / "tensorboard")["sft"], "train_step/loss") == [(1, 2.5), (2, 1.25)]


def test_not_a_run_directory(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(BASE))
    r = convert(tmp_path)
    assert r.returncode == 2
    assert f"{tmp_path} is not a run directory: it has no config.yaml" in r.stderr
    assert not (tmp_path / "tensorboard").exists()


def test_refuses_an_out_dir_it_did_not_write(tmp_path):
    run = make_run(tmp_path, BASE)
    out = tmp_path / "elsewhere"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = convert(run, "--out", str(out))
    assert r.returncode == 2
    assert "not written by this tool" in r.stderr and "notes.txt" in r.stderr
    assert os.listdir(out) == ["notes.txt"]
    # Ours, with something foreign added in a stage folder: refused too, nothing removed.
    assert convert(run).returncode == 0
    stray = run / "tensorboard" / "sft" / "plot.png"
    stray.write_text("x")
    r = convert(run)
    assert r.returncode == 2 and "sft/plot.png" in r.stderr
    assert stray.exists() and len(os.listdir(run / "tensorboard" / "sft")) == 2


# ---- --wandb: the offline W&B run, read back record by record ------------------------------------

def wandb_records(path):
    """The protobuf records (wandb's own Record message) of an offline run's .wandb file: W&B's
    header (":W&B", magic, version: 7 bytes), then LevelDB log records (crc32, length, type) in
    32 KiB blocks, a record split across blocks as FIRST, MIDDLE..., LAST."""
    import struct
    from wandb.proto import wandb_internal_pb2
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, part, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack_from("<IHB", data, pos)
        if kind == 0:  # zeroed rest of a block
            pos += left
            continue
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            out.append(wandb_internal_pb2.Record.FromString(part))
            part = b""
    return out


def wandb_history(run):
    """(the run record, [{key: value} of each wandb.log]) of RUN/wandb's only offline run."""
    runs = sorted((run / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    (file,) = runs[0].glob("run-*.wandb")
    records = wandb_records(file)
    (info,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    rows = [{(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]
    return info, rows


def test_wandb_offline_run_has_every_scalar_once_after_a_resume_cut(tmp_path):
    pytest.importorskip("wandb")
    run = make_run(tmp_path, BASE + RL)
    r = convert(run, "--wandb")
    assert r.returncode == 0, r.stderr
    info, rows = wandb_history(run)
    assert info.display_name == "run1" and info.project == "crucible"
    config = {i.key: json.loads(i.value_json) for i in info.config.update}
    assert config["run"] == {"name": "t1", "seed": 7}
    loss = [(row["step"], row["train_step/loss"]) for row in rows if "train_step/loss" in row]
    assert loss == [(1, 2.5), (2, 1.25), (3, -0.125)]
    assert [row["verdict/speedup"] for row in rows if "verdict/speedup" in row] == [1.5, 3]
    assert any(row.get("devices/cuda:0/evaluation_share") == 0.25 for row in rows)
    # The resume cut (as in the TensorBoard case): the offline run is written again, each step once.
    (run / "metrics.jsonl").write_text("".join(BASE[:5] + [sft_step(2, 0.75, 20), sft_step(3, 0.5, 21)]))
    r = convert(run, "--wandb")
    assert r.returncode == 0, r.stderr
    _, rows = wandb_history(run)
    assert [(row["step"], row["train_step/loss"]) for row in rows if "train_step/loss" in row] == [
        (1, 2.5), (2, 0.75), (3, 0.5)]
    assert not any("verdict/speedup" in row and row["step"] == 3 for row in rows)
