"""tools/report_records.py: a run's metrics.jsonl -> its records, checked, and the data that
tools/report_plots.py draws: each stage's runs of steps, the verdicts, the lifecycle records and a
sampling stage's learning summary."""
from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

STAGE_LABELS = {"sft": "SFT", "rl": "RL", "self_supervised": "Self-supervised", "search": "Search",
                "warm_start": "Warm start", "sampling": "Sampling", "training": "Training"}


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
    # How far from the hardware's limit (docs/evaluator.md, "How far from the limit"): the
    # candidate's and the reference's fractions of the task's bound; None where the verdict had none.
    fraction: float | None = None
    ref_fraction: float | None = None
    of_bytes: bool = False  # the candidate's fraction is of the bound's bytes part (`fraction_of`)


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
                                    segment, f.number("fraction"), f.number("ref_fraction"),
                                    f.string("fraction_of") == "bytes_ms"))
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
