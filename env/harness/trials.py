"""env/harness/trials.py: the candidate's load and correctness trials (Worker.load_phase,
construct_model, trial_phase): its module executed under the integrity snapshots, ModelNew built,
each trial's outputs sent to the evaluator with the runtime checks after every call (threads,
patched state, aliasing, inputs unchanged), and the profiled call that counts its kernels against
the reference's. Worker (worker.py) takes these methods from _TrialPhase; what they make of the
candidate is data, a Candidate."""
import warnings

from .trusted import (
    _abs, _active_count, _BaseException, _bool, _DeviceType, _enumerate, _Ev_elapsed, _Ev_record,
    _Ev_synchronize, _format_exception_only, _get_native_id, _getattr, _isinstance, _len, _list, _param_empty,
    _param_positional_only, _param_positional_or_keyword, _perf_counter_ns, _profile, _ProfilerActivity, _range,
    _repr, _reseed_visible, _set, _setprofile, _signature, _sorted, _str, _sum, _sys_modules,
    _torch_manual_seed, _type
)
from .builds import _use_build_service
from .integrity import _snapshots
from .channel import _Done, _error_done, _exc_line, _exc_text, _is_oom, _tail
from .reference import device_done
from .outputs import (
    _aliased_outputs, _clone_inputs, _encode, _input_layout, _inputs_unchanged, _os_threads, _py_threads,
    _thread_cpu_ns, _thread_names, _tids
)

# How long the profiled call of trial 0 stays under the profiler after its stop event
# (Worker.profiled, check_device_time).
_LATE_WORK_NS = 2_000_000


# Operators that compute nothing (views, metadata, allocation, reading a scalar): not evidence of
# a candidate's own work when they are all it adds to the reference's operators (own_work, CPU).
_NO_KERNEL_OPS = frozenset("aten::" + n for n in (
    "view", "view_as", "reshape", "_reshape_alias", "_unsafe_view", "flatten", "unflatten", "slice", "select",
    "narrow", "split", "split_with_sizes", "chunk", "unbind", "as_strided", "expand", "expand_as", "permute",
    "transpose", "t", "numpy_T", "unsqueeze", "squeeze", "contiguous", "detach", "alias", "lift_fresh",
    "empty", "empty_like", "empty_strided", "resize_", "item", "_local_scalar_dense", "size", "stride",
    "is_nonzero", "result_type", "to", "_to_copy", "numpy", "set_"))


class Candidate:
    """What the load and trial phases make of the candidate, for the phases after them (the
    timing, executor.py's commands). Made by load_phase before the candidate's module executes.

    module      the candidate's module (crucible_candidate)
    cls         its ModelNew
    model       ModelNew(*get_init_inputs()) on the device (construct_model)
    load_py0    (Python threads, thread states) before the module executed (_py_threads)
    load_os0    the process's OS threads before the module executed (_os_threads; -1: unknown)
    thread_base the OS threads before the candidate's first call (trial_phase), or None where
                they cannot be watched: any other thread is watched in the timing rounds
                (timing.py, ThreadWatch)
    """
    __slots__ = ("module", "cls", "model", "load_py0", "load_os0", "thread_base")

    def __init__(self):
        self.module = None
        self.cls = None
        self.model = None
        self.load_py0 = None
        self.load_os0 = -1
        self.thread_base = None


class _TrialPhase:
    """The load and trial phases' methods of Worker, with the kernel counting (profiled) that
    start-up and the reference phase also use."""

    def load_phase(self, src):
        t0 = _perf_counter_ns()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # reading deprecated module attributes warns
            self.core, self.full = _snapshots(self.harness, self.early_snapshots)
            self.early_snapshots = None
            # The task's module and class: the reference is timed after the candidate ran (in
            # this process only where the verdict has one worker).
            if self.reference.task is not None:
                self.core.add_module("task", self.reference.task, "callables")
                self.core.add_class(self.reference.task.Model)
        self.flags0 = self.flags()
        self.candidate = Candidate()
        py0 = _py_threads()
        self.candidate.load_os0 = _os_threads()
        t0 = self.lap("load: snapshots", t0)
        # The candidate's module: syntax errors, import errors and extension build failures.
        # load_inline and load calls made while the module executes are built by the evaluator
        # (_keyed_build): the request goes out on the channel, the reply names the cache entry.
        _use_build_service(self.request_build)
        try:
            _reseed_visible()
            self.candidate.module = self.exec_module("crucible_candidate", src, "candidate.py")
        except _BaseException as e:
            if _isinstance(e, _Done):
                raise
            if _isinstance(e, SyntaxError):
                raise _Done("compile_error", (), "syntax error: " + _tail("".join(_format_exception_only(_type(e), e)), 8)) from None
            text = _str(e)
            if "Error building extension" in text or "ninja" in text.lower():
                raise _Done("compile_error", (), "extension build failed:\n" + _tail(text, 40)) from None
            if _is_oom(e):
                raise _Done("runtime_error", (), "out of memory while importing the candidate: " + _exc_line(e)) from None
            raise _Done("compile_error", (), "the candidate module failed to import:\n" + _exc_text(e)) from None
        finally:
            _use_build_service(None)
        t0 = self.lap("load: candidate module", t0)
        self.check_state("after the candidate module executed")
        self.check_full("after the candidate module executed")
        self.check_threads_load(py0, "while the candidate module executed")
        self.lap("load: snapshot checks", t0)
        cls = _getattr(self.candidate.module, "ModelNew", None)
        if not _isinstance(cls, type):
            raise _Done("compile_error", (), "the candidate defines no class ModelNew")
        if self.job.static and self.job.role == "candidate":
            wrong = self.signature_mismatch(cls)
            if wrong:
                raise _Done("rejected", ["static:hyperparameters"],
                            wrong + ": constructor arguments and defaults must not change")
        elif self.job.static:
            self.check_signature(cls)
        self.candidate.cls = cls
        self.candidate.load_py0 = py0

    def construct_model(self):
        """ModelNew(*get_init_inputs()) on the device, once the evaluator holds it."""
        cls = self.candidate.cls
        py0 = self.candidate.load_py0
        try:
            _torch_manual_seed(self.job.seed)
            ref = self.reference
            init = _list(ref.init_inputs if self.job.role == "candidate" else ref.task.get_init_inputs())
            self.candidate_flags()
            model = cls(*init)
            model = model.to(self.device)
            if self.job.eval_mode:
                model.eval()
            self.sync()
        except _BaseException as e:
            raise _error_done(e, "while constructing ModelNew") from None
        self.candidate.model = model
        self.check_state("after ModelNew was constructed")
        self.check_threads_load(py0, "while ModelNew was constructed")

    def check_threads_load(self, before, where):
        now = _py_threads()
        if now[0] > before[0] or now[1] > before[1]:
            raise _Done("rejected", ["runtime:threads"],
                        f"the candidate started Python threads {where} ({before[0]} -> {now[0]}: "
                        f"{_thread_names() or 'threads unknown to threading'})")
        # Threads started from C++ (an extension's static initialiser or constructor): the
        # runtimes start theirs lazily in the first call, not while a module loads.
        os0 = self.candidate.load_os0
        if os0 >= 0:
            os1 = _os_threads()
            if os1 > os0:
                raise _Done("rejected", ["runtime:threads"],
                            f"the candidate left {os1 - os0} new OS thread(s) running {where}")

    def check_signature(self, cls):
        def params(c):
            sig = _signature(c.__init__)
            return _list(sig.parameters.values())[1:]  # without self

        try:
            want = params(self.reference.task.Model)
            got = params(cls)
        except (TypeError, ValueError) as e:
            raise _Done("rejected", ["static:hyperparameters"], f"cannot read ModelNew.__init__'s signature: {e}")

        def same_default(a, b):
            if a is _param_empty or b is _param_empty:
                return a is b
            try:
                return _bool(a == b)
            except Exception:
                return _repr(a) == _repr(b)

        # get_init_inputs() binds by position: a positional parameter may be renamed
        # (input_size -> in_features), its position, kind and default may not change.
        positional = (_param_positional_only, _param_positional_or_keyword)
        ok = _len(want) == _len(got) and all(
            (w.name == g.name or w.kind in positional)
            and w.kind == g.kind and same_default(w.default, g.default)
            for w, g in zip(want, got))
        if not ok:
            fmt = lambda ps: "(" + ", ".join(_str(p) for p in ps) + ")"  # noqa: E731
            raise _Done("rejected", ["static:hyperparameters"],
                        f"ModelNew.__init__{fmt(got)} differs from Model.__init__{fmt(want)}: "
                        "constructor arguments and defaults must not change")

    # -- candidate calls -----------------------------------------------------------------------
    def call_candidate(self, inputs, where, check_os_threads=True, profile=False):
        py0 = _py_threads()
        os0 = _os_threads()
        counts = None
        _reseed_visible()
        self.candidate_flags()
        if self.timing_now:
            self.foreign_mark(True)
        try:
            if profile:
                out, counts = self.profiled(lambda: self.candidate.model(*inputs))
            else:
                out = self.candidate.model(*inputs)
                if self.timing_now:
                    self.foreign_mark(False)
                self.sync()
        except _BaseException as e:
            raise _error_done(e, f"in ModelNew.forward ({where})") from None
        self.after_call(py0, os0, where, check_os_threads)
        return out, counts

    def after_call(self, py0, os0, where, check_os_threads):
        py1 = _py_threads()
        if py1[0] != py0[0] or py1[1] != py0[1]:
            raise _Done("rejected", ["runtime:threads"],
                        f"{where}: Python threads {py0[0]} before the candidate's forward, {py1[0]} after "
                        f"({py0[1]} -> {py1[1]} thread states; other threads: {_thread_names() or 'none'})")
        if check_os_threads and os0 >= 0:
            os1 = _os_threads()
            if os1 > os0:
                raise _Done("rejected", ["runtime:threads"],
                            f"{where}: the candidate's forward left {os1 - os0} new OS thread(s) running")
        self.check_state(where)

    def trial_phase(self):
        pending = []
        # The OS threads before the candidate's first call, which may start threads (the
        # runtimes start theirs lazily there); any other thread is watched in the timing rounds.
        base = _tids()
        me = _get_native_id()
        if base is not None and me in base and _thread_cpu_ns(me) is not None:
            self.candidate.thread_base = base
        else:
            self.laps["timing: foreign threads check unavailable"] = 1
        for t in _range(self.reference.trials):
            inputs = self.trial_inputs(t)
            if self.job.jitter_bytes >= 512:  # placed as the timed calls' inputs are: nothing tells them apart
                inputs = self.placed(inputs)
            pristine = _clone_inputs(inputs)
            layout = _input_layout(inputs)
            before = _active_count()
            where = f"trial {t}"
            out, _ = self.call_candidate(inputs, where, check_os_threads=t > 0)
            aliased = _aliased_outputs(out, inputs)
            frames = []
            msg = {"type": "candidate", "trial": t, "distribution": self.reference.trial_dists[t],
                   "outputs": _encode(out, frames, self.device, self.exports)}
            del out
            unchanged = _inputs_unchanged(inputs, layout, pristine)
            if t > 0 and unchanged:  # a changed input is the evaluator's runtime:input_mutation
                self.check_aliasing(aliased, where)
            if t == 0:
                # Determinism, and kernel counting on a second call with the same inputs (a
                # candidate that caches by pointer or identity launches nothing here).
                out, counts = self.call_candidate(inputs, where + ", second call", check_os_threads=False,
                                                  profile=True)
                msg["repeat_outputs"] = _encode(out, frames, self.device, self.exports)
                del out
                unchanged = unchanged and _inputs_unchanged(inputs, layout, pristine)
                if self.reference.kernel_mode is not None:
                    n = self.kernel_count(counts)
                    if n == 0:
                        raise _Done("rejected", ["runtime:no_kernel"],
                                    "no kernel or operator ran in the candidate's forward "
                                    f"(profiled on the second call of trial 0; counted {self.reference.kernel_mode})")
                    msg["kernels"] = n
                own = self.own_work(counts)
                if own is not None:
                    msg["own_kernels"] = own
                shares = self.profile_shares(counts)
                if shares is not None:
                    msg["profile"], msg["own_share"] = shares
                self.check_device_time(counts, where + ", second call")
                if unchanged:  # after the kernel count
                    self.check_aliasing(aliased, where)
            msg["inputs_unchanged"] = unchanged
            msg["threads_before"] = before
            msg["threads_after"] = _active_count()
            pending.append((msg, frames))
            del inputs, pristine, frames
        device_done(self, pending)

    def check_aliasing(self, aliased, where):
        """runtime:aliased_output: an output that shares memory with an input where the
        reference's (on the task's own inputs) does not. A view of an input runs no computation,
        and on inputs for which it happens to be right it would be credited as a kernel."""
        for i, a in _enumerate(aliased):
            if a and not (i < _len(self.reference.aliased) and self.reference.aliased[i]):
                raise _Done("rejected", ["runtime:aliased_output"],
                            f"{where}: output {i} shares memory with an input, where the reference's output does "
                            "not; returning an input or a view of one is not a computation")

    # -- kernel counting -----------------------------------------------------------------------
    def profiled(self, fn):
        """Runs fn() once under torch.profiler (and, for extension calls, sys.setprofile).
        Returns (result, counts) with counts = dict(device, launches, ops, ext)."""
        acts = [_ProfilerActivity.CPU]
        if self.cuda:
            acts.append(_ProfilerActivity.CUDA)
        modules = _sys_modules
        ext_calls = [0]

        def hook(frame, event, arg):
            # A call into a compiled extension outside every imported package: load_inline's
            # modules and inductor's CPU kernels ("<hash>.kernel") have no top-level package in
            # sys.modules, unlike torch's, numpy's or the builtins' functions.
            if event == "c_call":
                m = _getattr(arg, "__module__", None)
                if _isinstance(m, str) and m.partition(".")[0] not in modules:
                    ext_calls[0] += 1

        window_ms = None
        self.sync()  # nothing of the harness's still runs when the profiler starts
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the profiler warns about its event cycles
            with _profile(activities=acts) as prof:
                if self.cuda:
                    _Ev_record(self.ev0, self.stream0)
                _setprofile(hook)
                try:
                    out = fn()
                finally:
                    _setprofile(None)
                self.sync()
                if self.cuda:
                    _Ev_record(self.ev1, self.stream0)
                    _Ev_synchronize(self.ev1)
                    window_ms = _Ev_elapsed(self.ev0, self.ev1)
                    # The profiler stays on a moment longer: work that a thread of the candidate
                    # queues after the synchronisation lands in its record, not in the window.
                    t_late = _perf_counter_ns()
                    while _perf_counter_ns() - t_late < _LATE_WORK_NS:
                        pass
                    self.sync()
        dev = launches = ops = 0
        spans = []
        kernels, operators = {}, {}  # name -> count
        kernel_us, operator_us = {}, {}  # name -> time (us): device time, an operator's own CPU time
        for e in prof.events():
            name = e.name or ""
            if e.device_type == _DeviceType.CUDA:
                dev += 1
                spans.append((e.time_range.start, e.time_range.end))
                kernels[name] = kernels.get(name, 0) + 1
                kernel_us[name] = kernel_us.get(name, 0.0) + (e.time_range.end - e.time_range.start)
            elif "LaunchKernel" in name or "GraphLaunch" in name or "cuLaunch" in name:
                launches += 1
            elif "::" in name:
                ops += 1
                operators[name] = operators.get(name, 0) + 1
                operator_us[name] = operator_us.get(name, 0.0) + e.self_cpu_time_total
        # The device's busy time over all streams (the union of its activities' intervals, us).
        busy_us = 0.0
        end = None
        for a, b in _sorted(spans):
            if end is None or a > end:
                busy_us += b - a
                end = b
            elif b > end:
                busy_us += b - end
                end = b
        return out, {"device": dev, "launches": launches, "ops": ops, "ext": ext_calls[0],
                     "busy_ms": busy_us / 1e3, "window_ms": window_ms, "kernels": kernels, "operators": operators,
                     "kernel_us": kernel_us, "operator_us": operator_us}

    def profile_shares(self, counts):
        """For the feedback of a multi-turn episode (never the reward): the five kernels (device)
        or operators (CPU, their own time) that took most of the profiled call, as [[name,
        share]], largest first, and the share of its time in names the reference's profiled call
        did not run (None where the reference's profile is not known). None without any time."""
        device = self.reference.kernel_mode == "device" and counts["device"] > 0
        times = counts["kernel_us"] if device else {n: t for n, t in counts["operator_us"].items()
                                                    if n not in _NO_KERNEL_OPS}
        total = _sum(times.values())
        if not total > 0:
            return None
        top = _sorted(times.items(), key=lambda kv: -kv[1])[:5]
        ref = self.reference.profile
        own = None
        if ref is not None:
            theirs = ref["kernels" if device else "operators"]
            own = _sum(t for n, t in times.items() if n not in theirs) / total
        return [[n[:160], t / total] for n, t in top], own

    def check_device_time(self, counts, where):
        """The cross-check of the clock (CUDA Agent's): the profiler's device time over all
        streams for a call (profiled) against the clock's window for it, from the start event to
        the event after a device-wide synchronisation. Work the call started that the window
        does not hold (queued after the synchronisation, by a thread of the candidate) is a
        finding: runtime:unseen_work."""
        window = counts.get("window_ms")
        if window is None:
            return
        busy = counts["busy_ms"]
        if busy > window * 1.05 + 0.05:
            raise _Done("rejected", ["runtime:unseen_work"],
                        f"{where}: the profiler saw {busy * 1e3:.1f} us of device work from the candidate's "
                        f"call on all streams, the clock's window for it holds {window * 1e3:.1f} us; "
                        "work that runs after the call's clock stopped is not counted, so it is refused")

    def own_work(self, counts):
        """How far what the candidate's profiled call ran is from what the reference's profiled
        call ran: the launches by which their kernels differ, counted by name (device kernels
        where the device's activities are counted; else operators, views, metadata and
        allocations left out), plus the candidate's calls into compiled extensions. 0: it ran
        the reference's own kernels, each as many times (a fallback, or the reference itself:
        Dr. Kernel's lazy optimisation), which earns no speed credit (the evaluator caps its
        speedup at 1). The same kernels in other numbers (a chain of products reassociated, a
        normalisation folded away) differ. None where the reference's profile is not known."""
        ref = self.reference.profile
        if ref is None:
            return None
        key = "kernels" if self.reference.kernel_mode == "device" and counts["device"] > 0 else "operators"
        a, b = counts[key], ref[key]
        drop = _NO_KERNEL_OPS if key == "operators" else ()
        names = (_set(a) | _set(b)) - _set(drop)
        return _sum(_abs(a.get(n, 0) - b.get(n, 0)) for n in names) + counts["ext"]

    def kernel_count(self, counts):
        if self.reference.kernel_mode == "device":
            return counts["device"] + (counts["launches"] if counts["device"] == 0 else 0)
        if self.reference.kernel_mode == "launches":
            return counts["launches"]
        return counts["ops"] + counts["ext"]
