#!/usr/bin/env python3
"""crucible evaluator worker: evaluates ONE candidate kernel, then exits.

Started by the C++ evaluator (env/eval/sandbox.cpp) as

    PYTHON -I -B env/eval/harness/worker.py --endpoint ipc://SCRATCH/worker.sock \
        --device cpu|cuda --scratch SCRATCH

and driven over a ZeroMQ PAIR socket (the evaluator binds, this process connects) exactly as
docs/evaluator-protocol.md describes. See env/eval/harness/README.md for the checks.

Trust model. Everything this process does after the candidate's code has run is suspect, so:
  * every function the harness needs for timing, synchronisation, copying outputs, counting
    threads and talking to the evaluator is captured into a local reference at import time
    (trusted.py, bound by name in each module of the harness), before any candidate code exists
    (the C-level functions where torch has them, e.g. torch._C._cuda_synchronize rather than
    torch.cuda.synchronize);
  * an integrity snapshot (identity of the attributes of torch, torch.nn.functional,
    torch.Tensor, torch.cuda, torch.backends.*, time, builtins, the globals of this module and of
    every module of the harness with the classes they define, zmq.Socket, ...) is taken just
    before the candidate module executes and verified after it executes and after every
    candidate call ("runtime:patched"); a wider snapshot (every torch module loaded) is verified
    after loading and at the end;
  * process-wide settings (TF32, matmul precision, cudnn, thread counts, grad mode, torch
    function/dispatch modes, global module hooks, trace/profile functions) are fixed before the
    candidate runs and verified after every call ("runtime:backend_flags");
  * output comparison happens in the evaluator's process, on raw bytes sent from here or, on
    CUDA, on device copies of the outputs it maps from here (CUDA IPC) and compares with its
    own kernel.

The harness is this module and the package beside it: this folder as the package
crucible_harness (__init__.py), loaded by path below (_load_package) and taken out of sys.modules
again (_forget_package) before any candidate code exists, its modules importing one another with
relative imports, each holding one part: trusted.py (the captured references), builds.py (the
build services), device.py (the harness's own CUDA kernels), integrity.py (backend flags and
integrity snapshots), channel.py (the socket and the `done` outcomes), job.py (the job as data),
outputs.py (outputs, inputs and threads of a call), and the phases, each functions over the
phases' data on the Worker (its process's side of the job) and returning what they found as data:
reference.py (the reference), trials.py (load and trials) and executor.py (the two sides of the
trust boundary: the timing commands); static_checks.py and confine.py are
modules of it too. This module starts the worker (or the zygote that forks workers) and drives a
job from start to finish, handing each phase's data to the next (Worker.run).
"""
import os
import sys


def _set_harness_env():
    """Settings that must be in place before torch and triton are imported (and again in a
    forked worker, whose environment is replaced)."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no compile worker pools/threads
    os.environ["TRITON_F32_DEFAULT"] = "ieee"  # tl.dot on float32 is IEEE, like torch with TF32 off


_set_harness_env()

import argparse  # noqa: E402
import ctypes  # noqa: E402
import gc  # noqa: E402
import importlib.util  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import warnings  # noqa: E402

import numpy  # noqa: E402
import zmq  # noqa: E402,F401  (before torch, as it always was; Channel's socket)
import torch  # noqa: E402
import torch.autograd.profiler  # noqa: E402
import torch.autograd.profiler_util  # noqa: E402
import torch.nn  # noqa: E402
import torch.nn.functional  # noqa: E402
import torch.nn.modules.module  # noqa: E402
import torch.profiler  # noqa: E402


def _prewarm_dynamo():
    """torch.compile monkey-patches torch the first time it is used (torch.manual_seed,
    nn.Module.__init__/__setstate__, torch.jit.trace, optimizers). Apply those patches now, so a
    candidate that legitimately uses torch.compile does not look like it patched torch."""
    try:
        import torch._dynamo  # noqa: F401  (wraps torch.manual_seed)
        from torch._dynamo.eval_frame import TorchPatcher
        from torch._dynamo.mutation_guard import install_generation_tagging_init
        TorchPatcher.patch()
        install_generation_tagging_init()
    except Exception:  # an older or newer torch without these: the snapshot will tell
        pass
    # Inductor creates tqdm progress bars (disabled ones too); every tqdm instance starts tqdm's
    # monitor thread, which a candidate using torch.compile would then seem to have started.
    tq = sys.modules.get("tqdm.std")
    if tq is not None and hasattr(tq, "tqdm"):
        tq.tqdm.monitor_interval = 0


_prewarm_dynamo()


# ================================================================================================
# The harness's own modules: this folder as the package crucible_harness (__init__.py), loaded by
# path (the folder is read-only in the sandbox and not on sys.path under -I) at import, before any
# candidate code exists, and taken out of sys.modules again once this module has bound what it uses.

_HARNESS_DIR = os.path.dirname(os.path.realpath(__file__))
_PACKAGE_NAME = "crucible_harness"


def _load_package():
    """This folder as the package crucible_harness, every module of it loaded (its __init__.py
    imports them in order, each with relative imports of those before it). The package is in
    sys.modules while it loads, which relative imports need, and while this module binds what it
    uses from it (`from crucible_harness.trusted import ...`, below); _forget_package takes it
    and its modules out again."""
    spec = importlib.util.spec_from_file_location(_PACKAGE_NAME, os.path.join(_HARNESS_DIR, "__init__.py"),
                                                  submodule_search_locations=[_HARNESS_DIR])
    pkg = importlib.util.module_from_spec(spec)
    cached = _HARNESS_DIR in sys.path_importer_cache
    sys.modules[_PACKAGE_NAME] = pkg
    try:
        spec.loader.exec_module(pkg)
    except BaseException:
        _forget_package(pkg)
        raise
    if not cached:
        # The finder the submodules' imports made for this folder: no path to a fresh copy of a
        # harness module from it (a copy is not the harness's, but nothing should lead there).
        sys.path_importer_cache.pop(_HARNESS_DIR, None)
    return pkg


def _forget_package(pkg):
    """Takes crucible_harness and each of its modules out of sys.modules: no candidate can import
    one by name. The harness never imports one of its own after this (every name it uses is
    bound at import), so nothing needs them there."""
    prefix = _PACKAGE_NAME + "."
    for name in [n for n in sys.modules if n == _PACKAGE_NAME or n.startswith(prefix)]:
        del sys.modules[name]


_PACKAGE = _load_package()
_STATIC_CHECKS_MODULE = _PACKAGE.static_checks
_CONFINE = _PACKAGE.confine
# In the order they import one another: each imports only from those before it (__init__.py).
_OWN_MODULES = {name: getattr(_PACKAGE, name) for name in _PACKAGE.MODULES}
from crucible_harness.trusted import (  # noqa: E402
    _BaseException, _cuda_synchronize, _Exception, _fresh_seed, _gc_freeze, _dict, _int, _isinstance, _json_dumps,
    _json_loads, _len, _list, _ModuleType, _os_exit, _range, _os_getpid, _perf_counter_ns, _Random,
    _set_grad_enabled, _str, _T_fill_, _torch_empty, _type
)
from crucible_harness.builds import build_extension, build_triton, _prewarm, _use_triton_service  # noqa: E402
from crucible_harness.device import (  # noqa: E402
    _kernels, _load_kernels, _open_driver_ipc, _read_kernels_image, kind_of, KINDS, memory_census)
from crucible_harness.integrity import (  # noqa: E402
    _CANDIDATE_FLAG_SETTERS, _core_snapshot, _FLAG_GETTERS, _full_snapshot, _GLOBAL_HOOK_DICTS, _MODULE_MODULE,
    PRECISION_SETTINGS
)
from crucible_harness.channel import Channel, _Done, _build_log, _error_done, _exc_text, _is_oom, _OOM_CENSUS  # noqa: E402
from crucible_harness.job import parse_job  # noqa: E402
from crucible_harness.reference import poison_free_pool, profiled, reference_phase  # noqa: E402
from crucible_harness.trials import construct_model, load_phase, trial_phase  # noqa: E402
from crucible_harness.executor import (  # noqa: E402
    executor_loop, receive_trial_inputs, reference_info, take_reference_info
)
_forget_package(_PACKAGE)

# The harness's namespaces: this module's globals, the package's, the static checks' and each of
# the modules above. The integrity snapshots hold each whole ("all": any name rebound, added or
# deleted) with every class defined in it (integrity.py, _core_snapshot), so a patch of any
# function or constant of the harness, in whichever module, is runtime:patched. (Not confine.py's:
# it runs only before a Worker exists, and its ctypes structures would keep the snapshot off its
# fast path.)
_HARNESS_NAMESPACES = ((("worker", globals()), ("package", vars(_PACKAGE)),
                        ("static_checks", vars(_STATIC_CHECKS_MODULE)))
                       + tuple((name, vars(mod)) for name, mod in _OWN_MODULES.items()))


# ================================================================================================
# The worker.


class Worker:
    """One job, from start-up to `done`: the process's side of it (the channel, the device and
    its streams and events, the laps, the integrity snapshots and backend flags, the exports,
    the harness's generator and the state checks), start-up, and the job's course (run), which
    hands each phase's result to the next as data: the Job (job.py), the Reference and Baseline
    that reference_phase returns (reference.py) and the Candidate that load_phase makes
    (trials.py). The phases are functions over that data (reference.py, trials.py, executor.py), each given
    this Worker for the process's side (env/eval/harness/README.md, "The phases' data")."""

    def __init__(self, args):
        self.device = args.device
        self.kind = kind_of(args.device)  # what differs on this kind of device (device.py, DeviceKind)
        if self.kind.memory_info:  # an out-of-memory message says what the device had free
            _OOM_CENSUS[0] = memory_census
        self.scratch = args.scratch
        self.chan = Channel(args.endpoint)
        # Triton's builds go to the evaluator's build service from here on (set before the
        # worker's snapshots, so that they are part of what the runtime checks compare against).
        _use_triton_service(self.request_build, self.scratch)
        # What the integrity snapshots hold of the harness itself (load_phase).
        self.harness = _HARNESS_NAMESPACES
        self.core = None
        self.full = None
        self.flags0 = None
        self.exports = None  # a list while outputs stay on the device (job "outputs": "device")
        # Host milliseconds per step (reference, load, trials, timing rounds, finish), sent in
        # the `done` message for `crucible eval --verbose`: where a verdict's wall time goes.
        self.laps = {}
        # Python's cyclic garbage collections, by generation, and their milliseconds (laps
        # "gc: ..."; see quiet_gc in run()).
        self.gc_t0 = 0
        self.timing_now = False  # inside the timing commands (executor_loop): collections are also counted apart
        gc.callbacks.append(self.gc_lap)
        self.early_snapshots = None  # (core, full), made while waiting for the job (CUDA)
        self.isolation = None  # the sandbox's layers (confine.py), for the `started` message
        self.cand_flags = {}  # settings the candidate chose for its own calls (_CANDIDATE_FLAG_SETTERS)
        # Set by run when the job arrives: its arrival (perf_counter_ns) and the harness's own
        # generator (input placements, the checked calls of a timed sample, in-sample windows),
        # seeded by the OS.
        self.t_job = 0
        self.rng_random = None

    def lap(self, name, t0):
        """Adds the time since t0 (perf_counter_ns) to step `name`; returns now."""
        now = _perf_counter_ns()
        self.laps[name] = self.laps.get(name, 0.0) + (now - t0) / 1e6
        return now

    def gc_lap(self, phase, info):
        """gc.callbacks: counts each collection and its time."""
        if phase == "start":
            self.gc_t0 = _perf_counter_ns()
            return
        key = f"gc: generation {info['generation']} collections"
        self.laps[key] = self.laps.get(key, 0) + 1
        if self.timing_now:
            self.laps["gc: collections while timing"] = self.laps.get("gc: collections while timing", 0) + 1
        self.lap("gc: collections", self.gc_t0)

    # -- start-up --------------------------------------------------------------------------
    def start(self):
        threads = os.environ.get("CRUCIBLE_CPU_THREADS")
        if threads and threads.isdigit() and _int(threads) > 0:
            torch.set_num_threads(_int(threads))
        _set_grad_enabled(False)  # inference only, for the reference and the candidate alike
        # Fixed backend settings (checked after every candidate call).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.benchmark = False
        _prewarm(self.kind)
        # Device initialisation goes in three steps, each at the evaluator's word (the driver,
        # the context, the profiler's first use): it holds the device during those that must
        # not run beside another candidate's timed rounds (evaluator.init_hold).
        self.chan.send({"type": "started", "pid": _os_getpid(), "isolation": self.isolation})
        self.await_step("init")
        t_init = _perf_counter_ns()
        # torch asks NVML for the device count first; NVML cannot start inside the sandbox,
        # torch falls back to the CUDA runtime, and the warning it prints is noise.
        warnings.filterwarnings("ignore", message="Can't initialize NVML")
        if self.kind.driver:
            _open_driver_ipc()
            torch.cuda.init()  # cuInit; the context is created on the first allocation
        t_cuinit = _perf_counter_ns()
        self.chan.send({"type": "driver"})
        self.await_step("context")
        t_context0 = _perf_counter_ns()
        if self.kind.device_clock:
            self.stream0 = torch.cuda.current_stream()
            self.ev0 = torch.cuda.Event(enable_timing=True)
            self.ev_call = torch.cuda.Event(enable_timing=True)
            self.ev1 = torch.cuda.Event(enable_timing=True)
            _torch_empty(1, device=self.device)
            _cuda_synchronize()
            hardware = torch.cuda.get_device_name(0)
            kernels = _load_kernels()
        else:
            hardware = "cpu: " + _cpu_model()
            kernels = "none (CPU)"
        t_context = _perf_counter_ns()
        self.chan.send({"type": "context"})
        # The profiler's first use in a process (CUPTI on CUDA) takes about a second: pay it
        # here, in the warm pool, not in a job's trials. Without a GPU that first use also logs
        # "gpuGetDeviceCount failed" (libkineto) to the process's stderr, which is the user's
        # terminal: on the CPU it runs with fd 2 on /dev/null (no candidate code has run yet).
        quiet = saved = None
        try:
            if self.kind.quiet_first_profile:
                quiet = os.open(os.devnull, os.O_WRONLY)
                saved = os.dup(2)
                os.dup2(quiet, 2)
            profiled(self, lambda: _T_fill_(_torch_empty(1, device=self.device), 1))
        except _Exception:
            pass
        finally:
            if saved is not None:
                os.dup2(saved, 2)
                os.close(saved)
            if quiet is not None:
                os.close(quiet)
        # The host's other GPUs' device files are given up now, before any candidate code loads:
        # the driver, the context and the profiler have opened what they need (device.py,
        # DeviceKind.other_device_files; evaluator.cuda_own_device_only).
        if self.kind.other_device_files and os.environ.get("CRUCIBLE_OWN_DEVICE_ONLY") == "1":
            _CONFINE.narrow_devices(self.kind.other_device_files())
        t_profiler = _perf_counter_ns()
        self.chan.send({"type": "ready", "pid": _os_getpid(), "python": platform.python_version(),
                        "torch": torch.__version__.split("+")[0], "device": self.device,
                        "hardware": hardware, "kernels": kernels,
                        "init_ms": {"driver": (t_cuinit - t_init) / 1e6, "context": (t_context - t_context0) / 1e6,
                                    "profiler": (t_profiler - t_context) / 1e6}})

    def await_step(self, step):
        """Waits for the evaluator's {"type": step}: its word to go on initialising. A worker
        asked to `build` instead is a builder (the evaluator's build service): it builds, sends
        the library and exits, never touching the device."""
        msg = self.chan.recv()
        if step == "init" and msg.get("type") == "build":
            _use_triton_service(None, self.scratch)  # a builder builds here
            try:
                if msg.get("fn") in ("triton_cc", "triton_kernel"):
                    lib = build_triton(msg, self.scratch)
                else:
                    lib = build_extension(msg, self.scratch)
            except _BaseException as e:  # the build's own failure: its log goes back
                self.chan.send({"type": "build_failed", "log": _build_log(_str(e))})
            else:
                self.chan.send({"type": "built"}, [lib])
            self.chan.exit()
        if msg.get("type") != step:
            raise _Done("runtime_error", (), f"expected {step}, got {msg.get('type')!r}")

    def request_build(self, req):
        """The evaluator's build service (_keyed_build, Triton's hooks): one request, one reply.
        The evaluator lets go of the device while a build asked for during the trials runs (a
        load_inline in ModelNew's constructor), so whatever the candidate queued on it ends
        first: none of its kernels runs beside other evaluations' measured rounds meanwhile (a
        thread of its own that queued more would fail the thread checks after the constructor)."""
        self.kind.synchronize()
        self.chan.send(req)
        reply = self.chan.recv()
        if reply.get("type") == "stop":
            _os_exit(0)
        return reply

    # -- helpers, and the state checks after candidate code ran --------------------------------
    def sync(self):
        self.kind.synchronize()

    def flags(self):
        vals = {}
        for name, g in _FLAG_GETTERS:
            try:
                v = g()
            except Exception as e:  # noqa: BLE001
                v = "error: " + _type(e).__name__
            if name.startswith("sys."):
                v = v is None
            vals[name] = v
        for name, d in _GLOBAL_HOOK_DICTS:
            vals["nn.Module hooks " + name] = (_MODULE_MODULE.__dict__.get(name) is d, _len(d))
        if self.kind.stream_in_flags:
            try:
                vals["current_stream"] = torch._C._cuda_getCurrentStream(0)
            except Exception:
                pass
        return vals

    def check_state(self, where):
        """runtime:patched and runtime:backend_flags, after candidate code ran."""
        changed = _list(self.core.changed())
        # The worker's own methods replaced on its instance (reached through frames: refused
        # statically, and looked for here as well).
        changed += ["Worker." + k for k in _list(self.__dict__) if k in _WORKER_METHODS]
        if changed:
            raise _Done("rejected", ["runtime:patched"],
                        f"{where}: the candidate patched {', '.join(changed)}")
        now = self.flags()
        # The candidate's own settings (applied again before each of its calls, in
        # candidate_flags) are kept, and the harness's put back for everything else. Some are
        # derived from others (allow_tf32 from fp32_precision), so all are put back, in order.
        ours = False
        for name, _ in _CANDIDATE_FLAG_SETTERS:
            if name in self.cand_flags or now.get(name) != self.flags0.get(name):
                self.cand_flags[name] = now.get(name)
                ours = True
        if ours:
            self.apply_flags(self.flags0)
            now = self.flags()
        diff = [f"{k}: {self.flags0[k]!r} -> {now.get(k)!r}" for k in self.flags0 if now.get(k) != self.flags0[k]]
        if diff:
            raise _Done("rejected", ["runtime:backend_flags"],
                        f"{where}: the candidate changed process-wide settings: {'; '.join(diff)}")

    def precision(self, candidate):
        """The settings of PRECISION_SETTINGS in force for a side's calls, as text: the harness's
        for the reference; with the settings the candidate chose for itself (check_state) for the
        candidate."""
        vals = _dict(self.flags0 if self.flags0 is not None else self.flags())
        if candidate:
            vals.update(self.cand_flags)
        return {name: str(vals[name]) for name in PRECISION_SETTINGS if name in vals}

    def candidate_flags(self):
        """Puts the settings the candidate chose for itself (check_state) in force for its
        next call."""
        if self.cand_flags:
            self.apply_flags(self.cand_flags)

    @staticmethod
    def apply_flags(vals):
        """Sets the settings of _CANDIDATE_FLAG_SETTERS to `vals` (those it holds), in order. A
        legacy switch whose getter failed (the candidate used fp32_precision) is left to the
        fp32_precision settings that follow it."""
        for name, setter in _CANDIDATE_FLAG_SETTERS:
            v = vals.get(name)
            if v is None or (_isinstance(v, _str) and v.startswith("error: ")):
                continue
            try:
                setter(v)
            except Exception:  # noqa: BLE001
                pass  # what it leaves different from the harness's is refused by check_state

    def check_full(self, where):
        changed = self.full.changed()
        if changed:
            raise _Done("rejected", ["runtime:patched"],
                        f"{where}: the candidate patched {', '.join(changed)}")

    # -- the job -------------------------------------------------------------------------------
    def run(self):
        if self.kind.early_snapshots:
            # Ready, waiting for a job: make the snapshots now (~0.1 s on an H100's host), and
            # only bring them up to date when the candidate loads. (Not on the CPU, where this
            # would compete with a neighbour's timed rounds for the cores.)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.early_snapshots = (_core_snapshot(self.harness), _full_snapshot())
        msg = self.chan.recv()
        if msg.get("type") != "job":
            raise _Done("runtime_error", (), f"expected a job message, got {msg.get('type')!r}")
        self.t_job = _perf_counter_ns()
        # Every value comes from the evaluator (env/eval/worker_messages.cpp): a field the job lacks
        # ends it naming the field; the worker keeps no default of its own (job.py).
        job = parse_job(msg, self.kind)
        self.rng_random = _Random(_fresh_seed()).random
        # evaluator.quiet_gc: everything alive now (torch, the harness, its snapshots: some
        # 260,000 objects) leaves the cyclic collector's reach, so a collection scans only what
        # the job allocates; and the timing commands turn the collector off (executor_loop, as
        # timeit does), so no collection runs inside a timed call. A full collection over those objects took
        # 162-170 ms on an H100's host (docs/performance-history.md, "Where a sequential
        # verdict's time goes").
        if job.quiet_gc:
            _gc_freeze()
        # 3. Static checks, before any candidate code runs (by the reference worker where the
        # verdict has two: it parses the candidate's source and never runs it). A check of the
        # task alone (job.reference_only) builds and runs its reference on the first trial's
        # inputs, and looks at nothing of a candidate's.
        src = job.candidate_source
        task_src = job.task_source
        # Outputs stay on the device when the evaluator asks (each one the driver cannot export
        # still travels as bytes).
        self.exports = [] if job.outputs_on_device else None
        if job.static and job.role != "candidate":
            problems = _STATIC_CHECKS_MODULE.check_source(src, task_src)
            if problems:
                names = []
                for cls, _, _ in problems:
                    if cls not in names:
                        names.append(cls)
                text = "; ".join(f"line {line}: {m}" for _, line, m in problems[:20])
                raise _Done("rejected", names, text)

        self.redirect_output()

        if job.role == "candidate":
            self.candidate_job(job, src)
        # 4. Reference outputs, before the candidate is imported.
        ref, baseline = reference_phase(self, job, task_src)
        if job.role == "reference":
            self.chan.send(reference_info(ref))
            executor_loop(self, job, ref, baseline, None)
        # A job without a role is a check of the task alone (job.py, parse_job).
        raise _Done("ok", (), f"the task's reference ran on {ref.trials} trial input(s) and gave the "
                              "same outputs when called again")

    def candidate_job(self, job, src):
        """The candidate worker's job (role "candidate"): ModelNew loaded, built and run on the
        trials' inputs the evaluator gives, then the timing commands (executor.py). Never
        returns."""
        ref = take_reference_info(self, job)
        self.chan.send({"type": "phase", "name": "load"})
        cand = load_phase(self, job, ref, src)
        self.chan.send({"type": "loaded"})
        receive_trial_inputs(self, ref)
        t0 = _perf_counter_ns()
        construct_model(self, job, ref, cand)
        t0 = self.lap("trials: ModelNew", t0)
        poison_free_pool(self.kind)
        trial_phase(self, job, ref, cand)
        self.lap("trials: calls and outputs", t0)
        # Only the first trial's inputs are used from here on (each timing round's buffers start
        # with them): the others' memory, the device's where they stayed there, goes.
        for t in _range(1, _len(ref.given_inputs)):
            ref.given_inputs[t] = None
        executor_loop(self, job, ref, None, cand)

    def redirect_output(self):
        """The candidate's prints and build logs go to a file in the scratch directory."""
        if os.environ.get("CRUCIBLE_WORKER_KEEP_STDIO"):
            return
        try:
            fd = os.open(os.path.join(self.scratch, "worker.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        except OSError:
            pass

    def exec_module(self, name, src, filename):
        path = os.path.join(self.scratch, filename)
        with open(path, "w", encoding="utf-8") as f:
            f.write(src)
        mod = _ModuleType(name)
        mod.__file__ = path
        code = compile(src, path, "exec")
        sys.modules[name] = mod  # some libraries (dataclasses, triton, dynamo) look modules up
        exec(code, mod.__dict__)
        return mod


# Every method of Worker: one of them set on the instance (where it would shadow the method) is
# runtime:patched (Worker.check_state). The phases' functions are module globals of the harness,
# in the integrity snapshot's namespaces.
_WORKER_METHODS = frozenset(k for c in Worker.__mro__ if c is not object for k, v in vars(c).items() if callable(v))


def _cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _confine_worker(scratch, endpoint, kind):
    """Enters the worker's sandbox (confine.py) for a worker of `kind` (device.py, DeviceKind);
    forks where a PID namespace can be made, and only the child returns. Returns what is in
    force, for the `started` message."""
    socket_path = endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None
    mb = os.environ.get("CRUCIBLE_SCRATCH_MB", "")
    return _CONFINE.enter_worker(scratch, socket_path, _HARNESS_DIR, _int(mb) if mb.isdigit() else 2048,
                                 kind.device_nodes)


def _run_worker(args, isolation):
    w = Worker(args)
    w.isolation = isolation
    try:
        w.start()
        w.run()
        raise _Done("runtime_error", (), "the worker ended without a verdict")
    except _Done as d:
        w.chan.done(d.status, d.checks, d.message.replace(w.scratch + os.sep, ""), d.laps)
    except _BaseException as e:  # a harness bug or an unexpected failure: still answer
        if _is_oom(e):  # the harness's own buffers (a round's inputs, copies): named as such
            d = _error_done(e, "in the harness's own buffers (inputs, outputs and copies of the timing rounds)")
            w.chan.done(d.status, d.checks, d.message)
        else:
            w.chan.done("runtime_error", (), "worker error: " + _exc_text(e))
    _os_exit(0)


# ================================================================================================
# Zygote: a process that has imported everything above (torch, zmq, the dynamo patches, the
# static checks) but never touched the device, and forks one fresh worker per request. A fork
# takes tens of milliseconds where starting Python and importing torch takes seconds. Every
# worker is forked from the zygote itself, never from another worker, so nothing one candidate
# did is in the next one's process (docs/evaluator.md, Isolation).
#
# The evaluator (env/eval/sandbox.cpp, zygote) starts it like a worker, sandbox and all, with
# `--zygote` and a Unix socket as its stdin, and sends one JSON object per line:
#   {"type": "fork", "endpoint": "ipc://...", "scratch": DIR, "env": ["K=V", ...]}
#       -> {"type": "forked", "pid": N} or {"type": "error", ...}
#   {"type": "reap", "pid": N}  (once the evaluator has seen N end or has killed it)
#       -> {"type": "reaped", "pid": N, "code": C, "signal": S}
# The zygote reaps a worker only when asked, so a worker's pid cannot be reused while the
# evaluator may still signal its process group.

def _child_setup(req, zygote_pid, report_fd, kind):
    """In a freshly forked worker: the session, environment and descriptors a worker the
    evaluator executes itself gets (env/eval/sandbox.cpp), then the worker's sandbox (confine.py),
    which forks once more: only the worker itself returns, with what is in force."""
    os.setsid()  # own session and process group: kill(-pid) reaches every descendant
    _CONFINE.die_with_parent()  # the zygote
    if os.getppid() != zygote_pid:
        os._exit(1)  # the zygote died between the fork and the prctl
    os.chdir(req["scratch"])
    os.environ.clear()
    for kv in req["env"]:
        k, _, v = kv.partition("=")
        os.environ[k] = v
    _set_harness_env()
    import tempfile
    tempfile.tempdir = None  # recomputed from TMPDIR, the worker's own scratch directory
    # stdin (the zygote's control socket) becomes /dev/null; every other inherited descriptor
    # but the report pipe goes.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.closerange(3, report_fd)
    os.closerange(report_fd + 1, 65536)
    isolation = _confine_worker(req["scratch"], req["endpoint"], kind)
    # Fresh seeds for the global generators, as a new process would have.
    random.seed()
    numpy.random.seed()
    return isolation


def _cuda_touched():
    """Whether this process has initialised CUDA: a fork would then give workers a driver state
    they cannot use. The driver library may be loaded without being initialised (torch's CUDA
    libraries link it): cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED (3) before cuInit,
    and initialises nothing itself."""
    try:
        if torch.cuda.is_initialized():
            return True
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            if not any("/libcuda.so" in line for line in f):
                return False
        lib = ctypes.CDLL("libcuda.so.1", mode=getattr(os, "RTLD_NOLOAD", 4) | getattr(os, "RTLD_LAZY", 1))
        count = ctypes.c_int(0)
        return lib.cuDeviceGetCount(ctypes.byref(count)) != 3
    except OSError:
        return True  # cannot tell: do not fork


def zygote_main(args):
    ctl = 0
    zygote_pid = os.getpid()

    def reply(obj):
        data = (_json_dumps(obj) + "\n").encode("utf-8")
        while data:
            data = data[os.write(ctl, data):]

    # Confined first, while the process has one thread: a CUDA zygote's warm-ups (Triton's) start
    # threads, and a multi-threaded process cannot make a mount namespace (unshare: EINVAL).
    isolation = _CONFINE.enter_zygote()
    _prewarm(kind_of(args.device))
    reply({"type": "ready", "pid": zygote_pid, "isolation": isolation})
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = os.read(ctl, 65536)
            if not chunk:
                _os_exit(0)  # the evaluator closed its end
            buf += chunk
        line, _, buf = buf.partition(b"\n")
        req = _json_loads(line.decode("utf-8"))
        kind = req.get("type")
        if kind == "reap":
            pid = _int(req["pid"])
            try:
                _, status = os.waitpid(pid, 0)
                reply({"type": "reaped", "pid": pid, "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else 0,
                       "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0})
            except ChildProcessError:
                reply({"type": "reaped", "pid": pid, "code": -1, "signal": 0})
            continue
        if kind != "fork":
            reply({"type": "error", "message": f"unknown request {kind!r}"})
            continue
        if _cuda_touched():
            reply({"type": "error", "message": "the zygote has initialised CUDA; it cannot fork workers"})
            continue
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                isolation = _child_setup(req, zygote_pid, w, kind_of(args.device))
                os.write(w, b"+")
                os.close(w)
                _run_worker(argparse.Namespace(endpoint=req["endpoint"], device=args.device, scratch=req["scratch"]),
                            isolation)
            except _BaseException:
                pass
            _os_exit(126)
        os.close(w)
        got = b""
        while True:
            chunk = os.read(r, 16)
            if not chunk:
                break
            got += chunk
        os.close(r)
        if got[:1] != b"+":
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            reply({"type": "error", "message": "the forked worker failed to set itself up"})
            continue
        reply({"type": "forked", "pid": pid})


def main(argv=None):
    p = argparse.ArgumentParser(description="crucible evaluator worker (one candidate, then exit)")
    p.add_argument("--endpoint", default="")
    p.add_argument("--device", choices=tuple(KINDS), required=True)
    p.add_argument("--scratch", required=True)
    p.add_argument("--zygote", action="store_true", help="fork workers on request (stdin: control socket)")
    p.add_argument("--kernels", default="", help="fatbin of the harness's own kernels (env/eval/harness/harness_kernels.cu)")
    args = p.parse_args(argv)
    if args.kernels and kind_of(args.device).harness_kernels:
        # Read now, before any candidate runs (a zygote's workers inherit the bytes).
        _read_kernels_image(args.kernels)
    if args.zygote:
        zygote_main(args)
        _os_exit(0)
    if not args.endpoint:
        p.error("--endpoint is required")
    _run_worker(args, _confine_worker(args.scratch, args.endpoint, kind_of(args.device)))


if __name__ == "__main__":
    main()
