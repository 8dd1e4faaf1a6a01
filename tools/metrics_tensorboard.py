#!/usr/bin/env python3
"""TensorBoard event files from a run's metrics.jsonl (RUN/metrics.jsonl -> DIR/<stage>/events.out.tfevents.*).

Usage (with the project's interpreter, which has tensorboard: tools/setup.sh installs it):

    .venv/bin/python tools/metrics_tensorboard.py RUN [--out DIR] [--follow PID] [--poll-s S] [--wandb]

Then look at it with

    tensorboard --logdir RUN/tensorboard

--wandb also writes the same scalars into an offline Weights & Biases run (wandb.init(mode="offline"),
in RUN/wandb/offline-run-*; crucible train does this with log.wandb), uploaded afterwards with

    wandb sync RUN/wandb/latest-run

(wandb 0.30 and later no longer sync TensorBoard files themselves: `wandb sync --sync-tensorboard`
is gone.) The W&B run is named after RUN, in project $WANDB_PROJECT (default "crucible"), with
config.yaml as its config; its x axis is the record's "step" (define_metric), and its scalars have
the tags below. It is rewritten with the event files (below): each start removes the offline runs
it made before in RUN/wandb and writes one new run, so a step done again after a resume appears
once.

What is written (DIR defaults to RUN/tensorboard), with TensorBoard's own event-file writer
(tensorboard.summary.writer, which torch.utils.tensorboard.SummaryWriter wraps: that one costs a
3 s torch import and would tag the config "config/text_summary"):

- One subdirectory per stage (warm_start, sft, self_supervised, rl, ...: the record's "stage");
  records without a stage, or with an empty one (run_finished), and the run's config go to "run".
  TensorBoard shows each subdirectory as a run, so one tag is one chart with a line per stage.
- Every number of a record becomes a scalar tagged EVENT/KEY (train_step/loss, verdict/speedup,
  checkpoint/seconds, step_timing/round_trip_seconds), at global step = the record's "step" and
  wall time = its "time". EVENT is the record's "event" (or "kind", as crucible report reads it).
  "step" itself is the x axis and not repeated as a scalar. A record without a step (none of
  crucible's today) is put at the last step seen before it in the file (0 before any). A step
  has one point per record: an RL step's verdicts are several points at the step they were drawn
  at (the policy's step before the update). TensorBoard keeps scalars as float32 (a checkpoint's
  bytes past 2^24 are rounded).
- Booleans of a record's top level are per-record outcomes (verdict/correct, verdict/cache_hit,
  train_step/skipped) and become 0/1, so their average (several verdicts of a step, TensorBoard's
  smoothing) is a share. Strings and nulls (a verdict's speedup when it is not ok) are left out.
- Lists of objects are flattened by their label: train_step's "turns" (multi-turn episodes) as
  train_step/turns/<turn>/samples, .../correct_share, .../mean_speedup; nested objects as
  EVENT/KEY/SUBKEY. Booleans inside them are attributes, not outcomes, and are left out.
- The lifecycle records' "devices" go to devices/<device>/{seconds,evaluation_s,policy_s} and
  devices/<device>/evaluation_share (evaluation_s / seconds) and policy_share (policy_s / seconds),
  without the event's name, so each GPU's share is one series across run_paused, run_finished...
  (the device's "evaluator" flag is a role and is left out).
- config.yaml as text (tag "config", step 0, in a fenced code block) in "run".

Idempotent and crash-safe: DIR holds a marker file, .metrics_tensorboard, beside the stage
folders. At start the tool removes the stage folders it wrote before (folders that hold only
event files) and writes everything again from metrics.jsonl, so after a crash and a resume (which
cuts metrics.jsonl back to its last checkpoint, storage/metrics_log.hpp) a step done again shows
once, with its new values. A DIR that exists and holds anything else (or is not empty and has no
marker) is refused with exit 2; the marker is also locked, so two copies of the tool cannot write
one DIR: a start waits up to 30 s for the lock (the writer of a crashed process reads once more
and lets go), then exits 2.

--follow PID: after the first pass, reads what is appended to metrics.jsonl every --poll-s
seconds (default 2) and flushes the event files after each batch, until process PID is gone
(a zombie counts as gone); then it reads once more and exits 0. Only complete lines are read: a
torn last line (an append in flight) is read again at the next poll. When metrics.jsonl is cut
under it (a resume), it starts over from scratch.

Input: a line that is not a JSON object with a string "event"/"kind" is skipped with one warning
on stderr naming file:line (crucible report reads the records strictly; this tool only shows
them). A RUN without config.yaml, or a DIR that is not the tool's, exits 2; unreadable or
unwritable files exit 1. No environment variables.
"""
import argparse
import datetime
import fcntl
import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

try:
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorboard.plugins.text import metadata as text_metadata
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    import yaml
except ImportError as e:  # the system python3 has no tensorboard; the project's .venv does
    sys.exit(f"metrics_tensorboard: cannot import tensorboard with {sys.executable} ({e}); "
             "run it with the project's .venv/bin/python (tools/setup.sh installs tensorboard)")

PROG = "metrics_tensorboard"
# How long a start waits for the lock that another writer of DIR holds.
LOCK_WAIT_S = 30.0
MARKER = ".metrics_tensorboard"
EVENT_FILE_PREFIX = "events.out.tfevents."
RUN_DIR_NAME = "run"  # records without a stage, and the config
TAIL_CHECK_BYTES = 4096  # bytes before the read offset compared at each poll to notice a cut file
# Keys that are not measurements: the record's kind, where it goes, and its x axis.
NOT_SCALARS = {"event", "kind", "stage", "step", "time"}
# Keys that name an element of a list of objects (train_step's turns, a record's devices).
LABEL_KEYS = ("turn", "device", "name", "task")


class usage_error(Exception):
    """Bad input or a DIR that is not ours: exit 2."""


class file_cut(Exception):
    """metrics.jsonl no longer starts with what was read from it (a resume cut it): start over."""


def warn(msg):
    print(f"{PROG}: warning: {msg}", file=sys.stderr, flush=True)


# ---- records -> scalars -------------------------------------------------------------------------

def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def element_label(i, x):
    """The label of element i of a list of objects: its "turn"/"device"/... value, else i."""
    for k in LABEL_KEYS:
        v = x.get(k)
        if isinstance(v, str) and v:
            return v, k
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v), k
    return str(i), None


def flatten(prefix, value, out, top_level):
    """Appends (tag, number) for `value` under `prefix`: numbers, top-level booleans as 0/1,
    objects by key and lists by element (objects by their label)."""
    if is_number(value):
        try:
            out.append((prefix, float(value)))
        except OverflowError:  # an integer past a double's range: not plottable
            pass
    elif isinstance(value, bool):
        if top_level:
            out.append((prefix, 1.0 if value else 0.0))
    elif isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}/{k}", v, out, False)
    elif isinstance(value, list):
        for i, x in enumerate(value):
            if isinstance(x, dict):
                label, label_key = element_label(i, x)
                for k, v in x.items():
                    if k != label_key:
                        flatten(f"{prefix}/{label}/{k}", v, out, False)
            else:
                flatten(f"{prefix}/{i}", x, out, False)
    # strings and nulls: nothing


def device_scalars(devices, out):
    """devices/<device>/... of a lifecycle record's "devices" list, with the two shares."""
    for i, d in enumerate(devices):
        if not isinstance(d, dict):
            continue
        name, _ = element_label(i, d)
        for k, v in d.items():
            if k != "device":
                flatten(f"devices/{name}/{k}", v, out, False)
        seconds = d.get("seconds")
        if is_number(seconds) and seconds > 0:
            for part, share in (("evaluation_s", "evaluation_share"), ("policy_s", "policy_share")):
                if is_number(d.get(part)):
                    out.append((f"devices/{name}/{share}", d[part] / seconds))


def record_scalars(kind, record):
    """The (tag, value) pairs of one record, in the record's key order."""
    out = []
    for key, value in record.items():
        if key in NOT_SCALARS:
            continue
        if key == "devices" and isinstance(value, list):
            device_scalars(value, out)
        else:
            flatten(f"{kind}/{key}", value, out, True)
    return out


def stage_dir_name(record):
    """The subdirectory of a record: its stage, made safe as a folder name, or "run"."""
    stage = record.get("stage")
    if not isinstance(stage, str) or not stage:
        return RUN_DIR_NAME
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", stage)
    return RUN_DIR_NAME if name in (".", "..") else name


def wall_time_of(record):
    """Seconds since the epoch of the record's ISO 8601 "time" ("...Z"), or None."""
    t = record.get("time")
    if not isinstance(t, str):
        return None
    try:
        dt = datetime.datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return dt.timestamp()


# ---- the output directory ------------------------------------------------------------------------

class output_dir:
    """DIR with its marker, locked for this process's lifetime. Owns the stage folders in it."""

    def __init__(self, path):
        self.path = path
        self._lock_fd = None

    def claim(self):
        """Creates DIR or checks that it is ours, takes the lock, removes what we wrote before."""
        p = self.path
        if p.exists() and not p.is_dir():
            raise usage_error(f"--out {p} exists and is not a directory")
        p.mkdir(parents=True, exist_ok=True)
        marker = p / MARKER
        entries = sorted(os.listdir(p))
        if entries and MARKER not in entries:
            raise usage_error(f"{p} is not empty and was not written by this tool (no {MARKER} in it): "
                              f"it holds {', '.join(entries[:5])}{' ...' if len(entries) > 5 else ''}; "
                              "choose another --out, or remove it")
        foreign = [f for e in entries if e != MARKER for f in self._foreign(p, e)]
        if foreign:
            raise usage_error(f"{p} holds files this tool did not write: {', '.join(foreign[:5])}"
                              f"{' ...' if len(foreign) > 5 else ''}; move them away, or choose another --out")
        # The marker first: a crash from here on leaves a DIR the next start recognises.
        self._lock_fd = os.open(marker, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        # A writer of the run's previous process (a crash, then a resume) reads once more after
        # that process ended and then lets go: wait for it, LOCK_WAIT_S at most.
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise usage_error(f"{p} is being written by another {PROG} (it has held the lock on {marker} "
                                      f"for {LOCK_WAIT_S:g} s)")
                time.sleep(0.2)
        os.ftruncate(self._lock_fd, 0)
        os.write(self._lock_fd, (f"Written by tools/metrics_tensorboard.py (pid {os.getpid()}); each of its "
                                 "starts removes the stage folders here and writes them again.\n").encode())
        self.clear()

    def clear(self):
        """Removes the stage folders (event files only; anything else added meanwhile is an error)."""
        entries = [e for e in sorted(os.listdir(self.path)) if e != MARKER]
        foreign = [f for e in entries for f in self._foreign(self.path, e)]
        if foreign:
            raise usage_error(f"{', '.join(foreign[:5])} appeared in {self.path} while {PROG} wrote it; "
                              "not removing anything")
        for e in entries:
            d = self.path / e
            for f in os.listdir(d):
                (d / f).unlink()
            d.rmdir()

    @staticmethod
    def _foreign(p, e):
        """What of entry e of DIR p this tool did not write (a stage folder holds event files only)."""
        d = p / e
        if d.is_symlink() or not d.is_dir():
            return [e]
        return [f"{e}/{f}" for f in sorted(os.listdir(d))
                if not f.startswith(EVENT_FILE_PREFIX) or (d / f).is_symlink() or not (d / f).is_file()]


# ---- the event files ------------------------------------------------------------------------------

class event_writers:
    """One EventFileWriter per stage folder, made when its first record comes. Not thread-safe."""

    def __init__(self, out):
        self._out = out
        self._writers = {}
        self.records = 0
        self.last_step = 0
        self.last_wall_time = None

    def _writer(self, name):
        w = self._writers.get(name)
        if w is None:
            # flush_secs: the tool flushes after each batch itself; the thread's timer is a backstop.
            w = self._writers[name] = EventFileWriter(str(self._out / name), max_queue_size=1000, flush_secs=30)
        return w

    def add_config(self, text, wall_time):
        """config.yaml as a markdown code block (a fence longer than any run of backticks in it)."""
        longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
        fence = "`" * max(3, longest + 1)
        body = f"{fence}yaml\n{text}{'' if text.endswith(chr(10)) else chr(10)}{fence}\n"
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[body.encode("utf-8")],
                                        tensor_shape=tensor_shape_pb2.TensorShapeProto())  # a scalar
        value = summary_pb2.Summary.Value(tag="config", tensor=tensor,
                                          metadata=text_metadata.create_summary_metadata(
                                              display_name="config", description="the run's config.yaml"))
        self._writer(RUN_DIR_NAME).add_event(
            event_pb2.Event(wall_time=wall_time, step=0, summary=summary_pb2.Summary(value=[value])))

    def add_record(self, record, where):
        """Writes one metrics record; `where` (file:line) names it in warnings. Returns (step,
        [(tag, value)]) of what it wrote, or None for a record it skipped."""
        kind = record.get("event", record.get("kind"))
        if not isinstance(kind, str) or not kind:
            warn(f"{where}: a record without a string \"event\" (or \"kind\"); skipped")
            return None
        step = record.get("step")
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            self.last_step = step
        step = self.last_step
        wall_time = wall_time_of(record)
        if wall_time is None:
            wall_time = self.last_wall_time if self.last_wall_time is not None else time.time()
        self.last_wall_time = wall_time
        scalars = record_scalars(kind, record)
        values = [summary_pb2.Summary.Value(tag=tag, simple_value=v) for tag, v in scalars]
        self.records += 1
        if values:
            self._writer(stage_dir_name(record)).add_event(
                event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=values)))
        return step, scalars

    def stages(self):
        return sorted(self._writers)

    def flush(self):
        for w in self._writers.values():
            w.flush()

    def close(self):
        for w in self._writers.values():
            w.close()
        self._writers.clear()


# ---- metrics.jsonl ------------------------------------------------------------------------------

class metrics_reader:
    """Reads the complete lines appended to metrics.jsonl since the last call. Notices a file cut
    or replaced under it (file_cut). The file may not exist yet (a run just started): no lines."""

    def __init__(self, path):
        self.path = path
        self.offset = 0  # bytes consumed: always the start of a line
        self.line = 0  # lines consumed
        self._tail = b""  # the last bytes before offset, compared at each read
        self._inode = None

    def read_new(self):
        """[(line number, bytes of the line)] of the complete lines after offset."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            if self.offset:
                raise file_cut()
            return []
        with f:
            st = os.fstat(f.fileno())
            if self.offset and (st.st_ino != self._inode or st.st_size < self.offset):
                raise file_cut()
            self._inode = st.st_ino
            f.seek(self.offset - len(self._tail))
            if f.read(len(self._tail)) != self._tail:
                raise file_cut()
            data = f.read()
        end = data.rfind(b"\n") + 1  # what follows the last newline is torn (an append in flight)
        lines = []
        for text in data[:end].split(b"\n")[:-1]:
            self.line += 1
            lines.append((self.line, text))
        if end:
            self.offset += end
            self._tail = (self._tail + data[:end])[-TAIL_CHECK_BYTES:]
        return lines


def parse_line(where, text):
    """The record of a line, or None (with a warning) where it is not a JSON object."""
    try:
        record = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        warn(f"{where}: not a JSON object ({e}); skipped")
        return None
    if not isinstance(record, dict):
        warn(f"{where}: not a JSON object (a JSON {type(record).__name__}); skipped")
        return None
    return record


def pid_alive(pid):
    """Whether process pid exists and is not a zombie (an exited child its parent has not reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] not in "ZX"
    except (OSError, ValueError, IndexError):
        return True  # no /proc: kill() said it exists


# ---- the pass ------------------------------------------------------------------------------------

class wandb_run:
    """An offline W&B run of the same scalars, in RUN/wandb. Each start() removes the offline runs
    made before (RUN/wandb/offline-run-*) and begins a new one."""

    def __init__(self, run):
        try:
            import wandb
        except ImportError as e:
            raise usage_error(f"--wandb: cannot import wandb with {sys.executable} ({e}); "
                              "tools/setup.sh installs it") from None
        self._wandb = wandb
        self._run_dir = run
        self.path = run / "wandb"
        self._run = None

    def start(self, config_text):
        self.close()
        if self.path.is_dir():
            for d in sorted(self.path.glob("offline-run-*")):
                if d.is_dir() and not d.is_symlink():
                    shutil.rmtree(d)
        try:
            config = yaml.safe_load(config_text)
        except yaml.YAMLError:
            config = None
        wandb = self._wandb
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "crucible", name=self._run_dir.resolve().name,
            dir=str(self._run_dir), mode="offline", config=config if isinstance(config, dict) else {},
            settings=wandb.Settings(console="off", save_code=False, disable_git=True, x_disable_stats=True,
                                    silent=True))
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")

    def add(self, step, scalars):
        if scalars:
            self._run.log({**dict(scalars), "step": step})

    def close(self):
        if self._run is not None:
            self._run.finish()
            self._run = None


class converter:
    """metrics.jsonl + config.yaml of one run -> the event files in one output_dir (and, with
    wandb, an offline W&B run)."""

    def __init__(self, run, out, wandb=None):
        self._run = run
        self._out = out
        self._metrics = run / "metrics.jsonl"
        self._reader = None
        self._writers = None
        self._wandb = wandb

    def start(self):
        """(Re)starts from scratch: removes the stage folders (and W&B runs), writes the config."""
        if self._writers:
            self._writers.close()
        self._out.clear()
        self._reader = metrics_reader(self._metrics)
        self._writers = event_writers(self._out.path)
        config = self._run / "config.yaml"
        text = config.read_text(encoding="utf-8", errors="replace")
        self._writers.add_config(text, config.stat().st_mtime)
        if self._wandb:
            self._wandb.start(text)

    def poll(self):
        """Writes the records appended since the last poll and flushes; starts over on a cut file."""
        try:
            lines = self._reader.read_new()
        except file_cut:
            print(f"{PROG}: {self._metrics} was cut back (a resume?); writing {self._out.path} again",
                  file=sys.stderr, flush=True)
            self.start()
            lines = self._reader.read_new()
        for n, text in lines:
            where = f"{self._metrics}:{n}"
            record = parse_line(where, text)
            if record is not None:
                written = self._writers.add_record(record, where)
                if written and self._wandb:
                    self._wandb.add(*written)
        self._writers.flush()

    def summary(self):
        return (f"{self._writers.records} records of {self._metrics} ({self._reader.line} lines) in "
                f"{self._out.path}: {', '.join(self._writers.stages())}")

    def close(self):
        if self._writers:
            self._writers.close()
        if self._wandb:
            self._wandb.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="Open with: tensorboard --logdir RUN/tensorboard. W&B (--wandb): wandb sync "
                                        "RUN/wandb/latest-run. Exit 2: not a run directory, "
                                        "or DIR not this tool's; 1: I/O errors.")
    ap.add_argument("run", type=Path, metavar="RUN", help="the run directory (config.yaml, metrics.jsonl)")
    ap.add_argument("--out", type=Path, metavar="DIR", help="where the event files go (default RUN/tensorboard)")
    ap.add_argument("--follow", type=int, metavar="PID",
                    help="keep reading appended records until process PID is gone, then exit")
    ap.add_argument("--wandb", action="store_true",
                    help="also write an offline W&B run of the same scalars into RUN/wandb (wandb sync to upload)")
    ap.add_argument("--poll-s", type=float, default=2.0, metavar="S",
                    help="with --follow: seconds between reads of metrics.jsonl (default 2)")
    args = ap.parse_args()
    if not (args.poll_s > 0):
        ap.error("--poll-s must be a positive number of seconds")
    if args.follow is not None and args.follow <= 0:
        ap.error("--follow takes a process id (a positive integer)")

    run = args.run
    if not (run / "config.yaml").is_file():
        print(f"{PROG}: {run} is not a run directory: it has no config.yaml", file=sys.stderr)
        return 2
    out = output_dir(args.out if args.out is not None else run / "tensorboard")
    # SIGTERM ends a --follow like Ctrl-C: the event files are flushed and closed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    conv = None
    try:
        conv = converter(run, out, wandb_run(run) if args.wandb else None)
        out.claim()
        conv.start()
        conv.poll()
        if args.follow is not None:
            print(f"{PROG}: {conv.summary()}; following pid {args.follow} every {args.poll_s:g} s", flush=True)
            while True:
                alive = pid_alive(args.follow)  # before the read: the last read is after the process ended
                conv.poll()
                if not alive:
                    break
                time.sleep(args.poll_s)
        print(f"{PROG}: {conv.summary()}", flush=True)
        return 0
    except usage_error as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # its text names the file
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if conv is not None:
            conv.close()


if __name__ == "__main__":
    sys.exit(main())
