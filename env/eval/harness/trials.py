"""env/eval/harness/trials.py: the candidate's load and correctness trials (load_phase,
construct_model, trial_phase): its module executed under the integrity snapshots, ModelNew built,
each trial's outputs sent to the evaluator with the runtime checks after every call (threads,
patched state, aliasing, inputs unchanged), and the profiled call that counts its kernels against
the reference's. Functions over the phases' data, on the Worker `w` (worker.py: its device,
channel, laps, snapshots and state checks); what they make of the candidate is data, a Candidate.
The candidate-call checks here (call_candidate, after_call, check_aliasing) are executor.py's
too."""
import warnings

from .trusted import (
    _abs, _active_count, _BaseException, _callable, _enumerate, _format_exception_only, _getattr, _isinstance,
    _json_dumps, _json_loads, _len, _list, _param_empty, _perf_counter_ns, _range, _repr, _reseed_visible, _set,
    _signature, _sorted, _str, _sum, _T_to, _Tensor, _torch_manual_seed, _type
)
from .builds import _use_build_service
from .integrity import _snapshots
from .channel import _Done, _error_done, _exc_line, _exc_text, _is_oom, _tail
from .reference import device_done, profiled
from .outputs import (
    _aliased_outputs, _clone_inputs, _encode, _input_layout, _inputs_unchanged, _os_threads, _placed, _plain,
    _py_threads, _thread_names
)


# Operators that compute nothing (views, metadata, allocation, reading a scalar): not evidence of
# a candidate's own work when they are all it adds to the reference's operators (own_work, CPU).
_NO_KERNEL_OPS = frozenset("aten::" + n for n in (
    "view", "view_as", "reshape", "_reshape_alias", "_unsafe_view", "flatten", "unflatten", "slice", "select",
    "narrow", "split", "split_with_sizes", "chunk", "unbind", "as_strided", "expand", "expand_as", "permute",
    "transpose", "t", "numpy_T", "unsqueeze", "squeeze", "contiguous", "detach", "alias", "lift_fresh",
    "empty", "empty_like", "empty_strided", "resize_", "item", "_local_scalar_dense", "size", "stride",
    "is_nonzero", "result_type", "to", "_to_copy", "numpy", "set_"))


class Candidate:
    """What the load and trial phases make of the candidate, for executor.py's timing commands. Made by load_phase before the candidate's module executes.

    module      the candidate's module (crucible_candidate)
    cls         its ModelNew
    model       ModelNew(*get_init_inputs()) on the device (construct_model)
    load_py0    (Python threads, thread states) before the module executed (_py_threads)
    load_os0    the process's OS threads before the module executed (_os_threads; -1: unknown)
    """
    __slots__ = ("module", "cls", "model", "load_py0", "load_os0")

    def __init__(self):
        self.module = None
        self.cls = None
        self.model = None
        self.load_py0 = None
        self.load_os0 = -1



# ------------------------------------------------------------------------------------------------
# The load phase.

def load_phase(w, job, ref, src):
    """The candidate's module executed from `src` under the integrity snapshots (taken, or
    brought up to date, here: worker `w`'s core and full snapshots and its backend flags), then
    checked, and its ModelNew's constructor compared with the reference's (`ref`). Returns the
    Candidate: module, cls and the threads before the module executed (load_py0, load_os0)."""
    t0 = _perf_counter_ns()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading deprecated module attributes warns
        w.core, w.full = _snapshots(w.harness, w.early_snapshots)
        w.early_snapshots = None
    w.flags0 = w.flags()
    cand = Candidate()
    py0 = _py_threads()
    cand.load_os0 = _os_threads()
    t0 = w.lap("load: snapshots", t0)
    # The candidate's module: syntax errors, import errors and extension build failures.
    # load_inline and load calls made while the module executes are built by the evaluator
    # (_keyed_build): the request goes out on the channel, the reply names the cache entry.
    _use_build_service(w.request_build)
    try:
        _reseed_visible()
        cand.module = w.exec_module("crucible_candidate", src, "candidate.py")
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
    t0 = w.lap("load: candidate module", t0)
    w.check_state("after the candidate module executed")
    w.check_full("after the candidate module executed")
    check_threads_load(cand, py0, "while the candidate module executed")
    w.lap("load: snapshot checks", t0)
    cls = _getattr(cand.module, "ModelNew", None)
    if not _isinstance(cls, type):
        raise _Done("compile_error", (), "the candidate defines no class ModelNew")
    if job.static:
        wrong = signature_mismatch(ref, cls)
        if wrong:
            raise _Done("rejected", ["static:hyperparameters"],
                        wrong + ": constructor arguments and defaults must not change")
    cand.cls = cls
    cand.load_py0 = py0
    return cand


def construct_model(w, job, ref, cand):
    """ModelNew(*get_init_inputs()) on the device, once the evaluator holds it (cand.model)."""
    cls = cand.cls
    py0 = cand.load_py0
    try:
        _torch_manual_seed(job.seed)
        init = _list(ref.init_inputs)
        w.candidate_flags()
        # load_inline and load calls of the constructor go to the evaluator's build service as
        # the module's do: built once for every worker, and without the device (the evaluator
        # lets go of it while the build runs).
        _use_build_service(w.request_build)
        try:
            model = cls(*init)
        finally:
            _use_build_service(None)
        model = model.to(w.device)
        if job.eval_mode:
            model.eval()
        w.sync()
    except _BaseException as e:
        if not _isinstance(e, _Done) and "Error building extension" in _str(e):
            raise _Done("compile_error", (), "extension build failed while constructing ModelNew:\n"
                        + _tail(_str(e), 40)) from None
        raise _error_done(e, "while constructing ModelNew") from None
    cand.model = model
    w.check_state("after ModelNew was constructed")
    check_threads_load(cand, py0, "while ModelNew was constructed")


def check_threads_load(cand, before, where):
    """runtime:threads: no new Python threads (`before`: _py_threads) and no new OS threads (than
    cand.load_os0) while the candidate's module executed or ModelNew was built."""
    now = _py_threads()
    if now[0] > before[0] or now[1] > before[1]:
        raise _Done("rejected", ["runtime:threads"],
                    f"the candidate started Python threads {where} ({before[0]} -> {now[0]}: "
                    f"{_thread_names() or 'threads unknown to threading'})")
    # Threads started from C++ (an extension's static initialiser or constructor): the
    # runtimes start theirs lazily in the first call, not while a module loads.
    os0 = cand.load_os0
    if os0 >= 0:
        os1 = _os_threads()
        if os1 > os0:
            raise _Done("rejected", ["runtime:threads"],
                        f"the candidate left {os1 - os0} new OS thread(s) running {where}")


def _param_descs(cls):
    """ModelNew's or Model's constructor parameters without self, as data: [name, kind, default]
    (default: {"value": JSON} or {"repr": text}, or null where there is none). The reference
    worker sends the task's in reference_info (executor.py)."""
    params = _list(_signature(cls.__init__).parameters.values())[1:]
    out = []
    for p in params:
        if p.default is _param_empty:
            default = None
        elif _plain(p.default):
            default = {"value": p.default}
        else:
            default = {"repr": _repr(p.default)}
        out.append([p.name, _str(p.kind), default])
    return out


def signature_mismatch(ref, cls):
    """The candidate worker's hyperparameter check against the reference's parameters
    (ref.signature), as data: None where they agree, else the text that says how they differ."""
    want = ref.signature
    if want is None:
        return None
    got = _json_loads(_json_dumps(_param_descs(cls)))  # as the reference's arrived: tuples become lists
    positional = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")

    def same(w, g):
        return ((w[0] == g[0] or w[1] in positional) and w[1] == g[1] and w[2] == g[2])

    if _len(want) == _len(got) and all(same(w, g) for w, g in zip(want, got)):
        return None

    def fmt(ps):
        return "(" + ", ".join(p[0] + ("" if p[2] is None else "=" + _str(p[2].get("value", p[2].get("repr"))))
                               for p in ps) + ")"
    return f"ModelNew.__init__{fmt(got)} differs from Model.__init__{fmt(want)}"


# ------------------------------------------------------------------------------------------------
# Candidate calls.

def call_candidate(w, cand, inputs, where, check_os_threads=True, profile=False):
    """One call of the candidate's model on `inputs`, with the checks after it (after_call);
    with `profile`, under the profiler (profiled). Returns (outputs, the profiler's counts or
    None)."""
    py0 = _py_threads()
    os0 = _os_threads()
    counts = None
    _reseed_visible()
    w.candidate_flags()
    try:
        if profile:
            out, counts = profiled(w, lambda: cand.model(*inputs))
        else:
            out = cand.model(*inputs)
            w.sync()
    except _BaseException as e:
        raise _error_done(e, f"in ModelNew.forward ({where})") from None
    after_call(w, py0, os0, where, check_os_threads)
    return out, counts


def after_call(w, py0, os0, where, check_os_threads):
    """The checks after a candidate call: runtime:threads (`py0`, `os0`: the threads before it)
    and the state checks (w.check_state)."""
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
    w.check_state(where)


# ------------------------------------------------------------------------------------------------
# The trial phase.

def trial_inputs(w, ref, t):
    """Trial t's inputs, as the evaluator gave them (ref.given_inputs, copied to the device)."""
    given = ref.given_inputs[t]
    if _callable(given):  # asked for now (executor.py, receive_trial_inputs)
        return given()
    if not w.kind.exports:  # the evaluator's bytes stay where they were received
        return given
    return [_T_to(x, w.device) if _type(x) is _Tensor else x for x in given]


def trial_phase(w, job, ref, cand):
    """The correctness trials: the candidate on each trial's inputs, its outputs sent (after the
    phase's device work, device_done) with what the checks found; trial 0 with a second, profiled
    call."""
    pending = []
    for t in _range(ref.trials):
        inputs = trial_inputs(w, ref, t)
        if job.jitter_bytes >= 512:  # placed as the timed calls' inputs are: nothing tells them apart
            inputs = _placed(inputs, job.jitter_bytes, w.rng_random)
        pristine = _clone_inputs(inputs)
        layout = _input_layout(inputs)
        before = _active_count()
        where = f"trial {t}"
        out, _ = call_candidate(w, cand, inputs, where, check_os_threads=t > 0)
        aliased = _aliased_outputs(out, inputs)
        frames = []
        msg = {"type": "candidate", "trial": t, "distribution": ref.trial_dists[t],
               "outputs": _encode(out, frames, w.device, w.exports)}
        del out
        unchanged = _inputs_unchanged(inputs, layout, pristine)
        if t > 0 and unchanged:  # a changed input is the evaluator's runtime:input_mutation
            check_aliasing(ref, aliased, where)
        if t == 0:
            # Determinism, and kernel counting on a second call with the same inputs (a
            # candidate that caches by pointer or identity launches nothing here).
            out, counts = call_candidate(w, cand, inputs, where + ", second call", check_os_threads=False,
                                         profile=True)
            msg["repeat_outputs"] = _encode(out, frames, w.device, w.exports)
            del out
            unchanged = unchanged and _inputs_unchanged(inputs, layout, pristine)
            if ref.kernel_mode is not None:
                n = kernel_count(ref, counts)
                if n == 0:
                    raise _Done("rejected", ["runtime:no_kernel"],
                                "no kernel or operator ran in the candidate's forward "
                                f"(profiled on the second call of trial 0; counted {ref.kernel_mode})")
                msg["kernels"] = n
            own = own_work(ref, counts)
            if own is not None:
                msg["own_kernels"] = own
            shares = profile_shares(ref, counts)
            if shares is not None:
                msg["profile"], msg["own_share"] = shares
            check_device_time(counts, where + ", second call")
            if unchanged:  # after the kernel count
                check_aliasing(ref, aliased, where)
        msg["inputs_unchanged"] = unchanged
        msg["precision"] = w.precision(True)
        msg["threads_before"] = before
        msg["threads_after"] = _active_count()
        pending.append((msg, frames))
        del inputs, pristine, frames
    device_done(w, pending)


def check_aliasing(ref, aliased, where):
    """runtime:aliased_output: an output that shares memory with an input where the
    reference's (on the task's own inputs: ref.aliased) does not. A view of an input runs no
    computation, and on inputs for which it happens to be right it would be credited as a kernel."""
    for i, a in _enumerate(aliased):
        if a and not (i < _len(ref.aliased) and ref.aliased[i]):
            raise _Done("rejected", ["runtime:aliased_output"],
                        f"{where}: output {i} shares memory with an input, where the reference's output does "
                        "not; returning an input or a view of one is not a computation")


# ------------------------------------------------------------------------------------------------
# Kernel counting (the profiled call itself: reference.py, profiled).

def profile_shares(ref, counts):
    """For the feedback of a multi-turn episode (never the reward): the five kernels (device)
    or operators (CPU, their own time) that took most of the profiled call, as [[name,
    share]], largest first, and the share of its time in names the reference's profiled call
    did not run (None where the reference's profile is not known). None without any time."""
    device = ref.kernel_mode == "device" and counts["device"] > 0
    times = counts["kernel_us"] if device else {n: t for n, t in counts["operator_us"].items()
                                                if n not in _NO_KERNEL_OPS}
    total = _sum(times.values())
    if not total > 0:
        return None
    top = _sorted(times.items(), key=lambda kv: -kv[1])[:5]
    profile = ref.profile
    own = None
    if profile is not None:
        theirs = profile["kernels" if device else "operators"]
        own = _sum(t for n, t in times.items() if n not in theirs) / total
    return [[n[:160], t / total] for n, t in top], own


def check_device_time(counts, where):
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


def own_work(ref, counts):
    """How far what the candidate's profiled call ran is from what the reference's profiled
    call ran (ref.profile): the launches by which their kernels differ, counted by name (device
    kernels where the device's activities are counted; else operators, views, metadata and
    allocations left out), plus the candidate's calls into compiled extensions. 0: it ran
    the reference's own kernels, each as many times (a fallback, or the reference itself:
    Dr. Kernel's lazy optimisation), which earns no speed credit (the evaluator caps its
    speedup at 1). The same kernels in other numbers (a chain of products reassociated, a
    normalisation folded away) differ. None where the reference's profile is not known."""
    theirs = ref.profile
    if theirs is None:
        return None
    key = "kernels" if ref.kernel_mode == "device" and counts["device"] > 0 else "operators"
    a, b = counts[key], theirs[key]
    drop = _NO_KERNEL_OPS if key == "operators" else ()
    names = (_set(a) | _set(b)) - _set(drop)
    return _sum(_abs(a.get(n, 0) - b.get(n, 0)) for n in names) + counts["ext"]


def kernel_count(ref, counts):
    """The candidate's kernels in its profiled call, counted as the reference's were
    (ref.kernel_mode)."""
    if ref.kernel_mode == "device":
        return counts["device"] + (counts["launches"] if counts["device"] == 0 else 0)
    if ref.kernel_mode == "launches":
        return counts["launches"]
    return counts["ops"] + counts["ext"]
