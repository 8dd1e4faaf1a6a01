"""env/eval/harness/timing.py: the timing phase of a job (timing, at each `time` message after the
trials): paired rounds of timed samples of the reference and the candidate on fresh inputs,
behind the cache flush and (CUDA) the gate, every timed call's outputs snapshotted as its clock
stops and checked against the reference's, the threads the candidate started watched, and the
physics floor measured; the times go back to the evaluator, which settles them. Functions over
the phases' data (the Job, Reference, Baseline and Candidate), on the Worker `w` (worker.py: its
device, events, laps and channel); the state they keep across `time` messages is data too:
TimingState, RoundChecks, ThreadWatch and CacheFlush."""
import torch

from .trusted import (
    _BaseException, _bool, _cuda_sleep, _cuda_synchronize, _enumerate, _Ev_elapsed, _Ev_record, _Ev_synchronize,
    _float, _fresh_seed, _gc_disable, _gc_enable, _gc_isenabled, _int, _int32, _int64, _isinstance, _len, _list,
    _max, _min, _os_exit, _perf_counter_ns, _range, _reseed_visible, _set, _sorted, _sum, _T_clone, _T_contiguous,
    _T_copy_, _T_data_ptr, _T_detach, _T_fill_, _T_is_contiguous, _T_is_floating_point, _T_numel, _T_reshape,
    _T_size, _T_to, _T_tolist, _T_zero_, _Tensor, _torch_count_nonzero, _torch_empty, _torch_eq,
    _torch_index_select, _torch_isclose, _torch_randint, _torch_stack, _torch_sum, _tuple, _type, _uint8
)
from .device import _kernels
from .channel import _Done, _error_done
from .reference import make_inputs
from .outputs import (
    _aliased_outputs, _call_all, _checked_reference, _clone_inputs, _os_threads, _output_bytes, _output_items,
    _output_storages, _placed, _py_threads, _Taken, _tensors_in, _thread_cpu_ns, _tids
)
from .trials import after_call, call_candidate, check_aliasing

# Device-side spin queued after the cache flush, before the start event: ~100 us at 2 GHz. The
# host launches the timed call while the device is still busy with the flush and the spin, so
# the start event is passed when the call's first kernel can start: the host's launch latency
# (10-40 us, varying from process to process) stays out of the stream time.
_LAUNCH_COVER_CYCLES = 200_000
# Clock warm-up (clock_warmup): spins per timed batch, and the least time spent spinning.
_CLOCK_BATCH = 40
_CLOCK_MIN_MS = 20.0
# Elements of each output compared in every timing round (check_round_outputs).
_ROUND_SAMPLE = 1 << 16
# Elements of each output snapshotted inside a timed sample, after every call but the last
# (_call_all): enough to catch a call that left its outputs unwritten or unfinished, few enough
# that the gather, which both samples hold, adds little to a 10 us call.
_INSIDE_SAMPLE = 1 << 12
# How long the gate before a timed sample (begin_sample) waits at most for the host to
# queue the sample's calls: 2e8 SM cycles, 100 ms at 2 GHz; a forward that waits for the device
# inside the sample waits this long. choose_calls keeps a sample's host time, as the first calls
# measured it, under _GATE_HOST_MS: a tenth of the wait, so that a host slower in the rounds than
# in the first calls still queues the sample in time. With a 20 ms wait and half of it as the
# target, one H100 verdict in two of a 38 us kernel (L2_T51 of dev6) had 1-5 samples time out
# (the host took 0.34 ms a call in the first calls and ~0.5 ms in the rounds), timed at the
# host's pace, and two of ten ended "unstable after max_rounds".
_GATE_CYCLES = 200_000_000
_GATE_MS = 100.0
_GATE_HOST_MS = 10.0
# Mismatch counters on the device for the round output checks read at once (check_round_fracs).
_ROUND_SLOTS = 1024
_WARMUP_SETTLED = 0.03
_ROUND_CHECKS = 4  # calls of a timed sample whose outputs are checked (timed_candidate)
_INPUTS_MS_PER_ROUND = 100.0  # host time a round may spend drawing its calls' inputs (choose_calls)


class TimingState:
    """The timing phase's rounds across the job's `time` messages (made by Worker.run, before any
    candidate code exists).

    warmed        the first calls have run and chosen `calls` (timing_rounds)
    prime_inputs  (reference's, candidate's) inputs of the last round's last call: the next
                  round's untimed priming calls run on them
    round_no      rounds begun (warm-up and measured)
    pair_first    whether the candidate went first in the first round of the pair under way; None
                  at the start of a pair (one_round)
    calls         calls per timed sample (choose_calls)
    host_ms       the host's time per call of the last timed sample
    cur_slack     the current round's rounding slack per output (tolerance)
    placements    the candidate's first input's addresses in the rounds so far
    floor_bytes   the fewest bytes a checked timed call of the candidate wrote (_output_bytes)
    floor_ms      the physics floor of a timed call (measure_floor), once measured
    can_spin      (CUDA) the harness's spin kernel or torch's _cuda_sleep exists
    """
    __slots__ = ("warmed", "prime_inputs", "round_no", "pair_first", "calls", "host_ms", "cur_slack", "placements",
                 "floor_bytes", "floor_ms", "can_spin")

    def __init__(self, can_spin):
        self.warmed = False
        self.prime_inputs = None
        self.round_no = 0
        self.pair_first = None
        self.calls = 1
        self.host_ms = 0.0
        self.cur_slack = []
        self.placements = set()
        self.floor_bytes = None
        self.floor_ms = None
        self.can_spin = can_spin


class RoundChecks:
    """The checks of the timed calls' outputs (check_round_outputs, check_round_fracs), made by
    Worker.run before any candidate code exists.

    round_fracs  (round, output, elements compared, count of matching elements or mismatch slot)
                 of the checks not yet read
    round_bad    (CUDA, harness kernels) the mismatch counters on the device, _ROUND_SLOTS of them;
                 None elsewhere
    round_used   the counters in use
    sample_gen   the generator that draws the compared positions (seeded by the OS)
    sample_bits  the seeds of the positions the harness kernels draw (getrandbits of a Random
                 seeded by the OS)
    """
    __slots__ = ("round_fracs", "round_bad", "round_used", "sample_gen", "sample_bits")

    def __init__(self, sample_gen, sample_bits):
        self.round_fracs = []
        self.round_bad = None
        self.round_used = 0
        self.sample_gen = sample_gen
        self.sample_bits = sample_bits


class ThreadWatch:
    """Threads the candidate started in its first calls, watched in the timing rounds
    (foreign_mark, check_foreign); the OS threads before them are the trials' (Candidate.thread_base).

    foreign         {thread: CPU time} of every such thread at the last mark; None before the first
    foreign_rounds  the rounds in which such threads ran outside the candidate's calls
    foreign_ns      their CPU time outside the calls
    """
    __slots__ = ("foreign", "foreign_rounds", "foreign_ns")

    def __init__(self):
        self.foreign = None
        self.foreign_rounds = set()
        self.foreign_ns = 0


class CacheFlush:
    """The cache flush's buffer (flush), made by Worker.run before any candidate code exists.

    buf    max(flush_bytes / 4, 1) int32 ones on the worker's device: read before every timed
           sample (L2 on CUDA, the last-level cache on the CPU)
    total  where the read's sum goes (flush without the harness kernels): an int64 scalar on
           the device
    """
    __slots__ = ("buf", "total")

    def __init__(self, flush_bytes, device):
        self.buf = _torch_empty(_max(flush_bytes // 4, 1), dtype=_int32, device=device)
        _T_fill_(self.buf, 1)
        self.total = _torch_empty((), dtype=_int64, device=device)


# ------------------------------------------------------------------------------------------------
# The cache flush, the spin and the gate.

def spin(cycles):
    """CUDA: keeps the device busy for `cycles` SM clock cycles (one thread)."""
    kernels = _kernels()
    if kernels is not None:
        kernels.spin(cycles)
    else:
        _cuda_sleep(cycles)


def flush(w, state, cache, k, cover=True):
    """Evict caches by reading flush_bytes of a scratch buffer (L2 on CUDA, LLC on CPU).
    Reading leaves clean lines behind: after a write-based flush the timed call paid for
    writing the flush's dirty lines back, a fixed cost that pulled every speedup toward 1.
    CUDA: nothing waits for it; with `cover` a spin follows on the stream (see
    _LAUNCH_COVER_CYCLES), and the caller records the start event and makes the call while
    the device works through both (a timed sample closes the gate instead: begin_sample)."""
    kernels = _kernels()
    if kernels is not None and w.kind.harness_kernels:
        kernels.flush(cache.buf)
    else:
        _torch_sum(cache.buf, 0, dtype=_int64, out=cache.total)
    if cover and w.kind.device_clock and state.can_spin:
        spin(_LAUNCH_COVER_CYCLES)


def begin_sample(w, state, cache, k):
    """CUDA, before a timed sample's start event: the cache flush, then the gate
    (_HarnessKernels.gate_close) where the harness kernels are loaded, else the spin that
    covers the first call's launch (flush). Returns whether the gate is closed: the caller
    queues the start event and the sample's calls, records its stop, and calls
    end_sample(gated) (in a finally), before it waits for the device.

    Behind the gate the device runs nothing until the host has queued the whole sample, so
    the calls run back to back as fast as the device runs them, and no call waits for the
    host to launch it: without it, a sample of 60 calls of a 15 us kernel was timed at the
    host's pace (25 us a call on an H100 host busy with other workers' builds, and that pace
    moved with the host's load). What is timed is the device's time for the calls' work; a
    forward that waits for the device (a synchronisation, .item()) holds the gate until
    _GATE_CYCLES run out and is then timed at the host's pace from there on. The gate fills
    every SM, so no stream of the candidate's runs ahead of the start event either."""
    kernels = _kernels()
    flush(w, state, cache, k, cover=kernels is None)
    if kernels is None:
        return False
    kernels.gate_close(_GATE_CYCLES)
    return True


def gated_calls(w, state, cache, fn, inputs, inside, snap_in, k):
    """CUDA: a timed sample's calls (_call_all) between the start event and the stream's stop
    event, behind the gate (begin_sample), which is opened however they end. The reference's
    sample and the candidate's run this same code; `snap_in` takes the in-sample snapshots
    (snapshot_inside). Returns (outputs, in-sample snapshots, whether the gate was closed); the
    caller waits for the device and reads the times."""
    gated = begin_sample(w, state, cache, k)
    _Ev_record(w.ev0, w.stream0)
    try:
        t_host = _perf_counter_ns()
        outs, inner = _call_all(fn, inputs, inside, snap_in)
        _Ev_record(w.ev_call, w.stream0)
        state.host_ms = (_perf_counter_ns() - t_host) / 1e6 / _len(inputs)
    finally:
        end_sample(gated)
    return outs, inner, gated


def finish_sample(w, gated, n):
    """CUDA, after gated_calls: waits for the whole device (work on side streams counts),
    records the stop event after it, counts a gate timeout, and returns the (synced, stream)
    milliseconds per call of the `n` calls (elapsed)."""
    _cuda_synchronize()
    _Ev_record(w.ev1, w.stream0)
    _Ev_synchronize(w.ev1)
    gate_outcome(w, gated)
    return elapsed(w, n)


def end_sample(gated):
    if gated:
        _kernels().gate_open()


def gate_outcome(w, gated):
    """After the device was waited for: counts a gate that stopped waiting before the host
    opened it (`timing: gate timeouts` in --verbose's laps)."""
    if gated and _kernels().gate_timed_out():
        w.laps["timing: gate timeouts"] = w.laps.get("timing: gate timeouts", 0) + 1


# ------------------------------------------------------------------------------------------------
# Timed samples and rounds.

def timed_reference(w, job, baseline, state, checks, cache, inputs, k, inside=False):
    """One timed sample of the reference: a call on each entry of `inputs` (a list of input
    lists), back to back between one start and one stop; with `inside`, the same snapshots as
    the candidate's in-sample ones are taken after every call but the last and dropped, so
    that both samples hold the same work. Returns ((synced, stream) ms per call, the list of
    the calls' outputs)."""
    n = _len(inputs)
    snap_in = snapshot_inside(w, checks)
    try:
        fn = baseline.fn
        static_out = None
        if job.baseline == "cuda-graph":  # one call per sample (choose_calls)
            graph, static, static_out = baseline.graph
            for s, x in zip(static, inputs[0]):
                if _isinstance(s, _Tensor):
                    _T_copy_(s, x)
            fn, inputs = graph.replay, [()]
        elif job.baseline == "compile-reduce-overhead" and baseline.mark_step is not None:
            baseline.mark_step()  # one call per sample with this baseline (choose_calls)
        if w.kind.device_clock:
            outs, _, gated = gated_calls(w, state, cache, fn, inputs, inside, snap_in, k)
            ms = finish_sample(w, gated, n)
            return ms, ([static_out] if static_out is not None else outs)
        flush(w, state, cache, k)
        t0 = _perf_counter_ns()
        outs, _ = _call_all(fn, inputs, inside, snap_in)
        t1 = _perf_counter_ns()
        ms = (t1 - t0) / 1e6 / n
        state.host_ms = ms
        return (ms, ms), outs
    except _BaseException as e:
        raise _error_done(e, "in the reference during timing") from None


def elapsed(w, n):
    """(synced, stream) milliseconds per call of the `n` calls just timed: from the start
    event to the stop event recorded after the device-wide synchronisation, and to the event
    recorded on the stream right after the last call returned, each divided by `n`. The
    evaluator settles the pair (env/eval/timing.hpp, settle_rounds): the first counts every stream
    but also the host's wake-up after the synchronisation, which differs from process to
    process."""
    return _Ev_elapsed(w.ev0, w.ev1) / n, _Ev_elapsed(w.ev0, w.ev_call) / n


def timed_candidate(w, ref, cand, state, checks, watch, cache, inputs, k, where, checked=1, inside=False):
    """One timed sample of the candidate: a call on each entry of `inputs` (a list of input
    lists), back to back between one start and one stop. Returns ((synced, stream) ms per
    call, ([(call index, snapshot, in-sample)], the calls' output pointers), the fewest
    output bytes among the checked calls).

    With `inside`, every call but the last has its outputs snapshotted inside the sample,
    right after it returns (_INSIDE_SAMPLE elements of each): the gather is queued on the
    stream behind the call's work, so it sees what the call left in its outputs before any
    later call ran (the reference's sample takes the same snapshots). A candidate that hands
    back one buffer and fills it only on some calls (the last of a sample, or whichever a
    device-side counter says is the newest), or leaves a call's work to a later call, fails
    there; and since every call is snapshotted, no call can learn (from the host's timing
    between calls, or on the device) which ones are. `checked` calls drawn at random are
    snapshotted in full as the clock stops, before anything else; every call's outputs are
    alive until then, and one that shares its buffer with later calls is checked against the
    last call that returned it (_checked_reference)."""
    model = cand.model
    n = _len(inputs)
    snap_in = snapshot_inside(w, checks)
    py0 = _py_threads()
    os0 = _os_threads()
    _reseed_visible()
    w.candidate_flags()
    foreign_mark(cand, state, watch, True)
    try:
        if w.kind.device_clock:
            # The stream's stop comes before the harness's own bookkeeping (the thread watch):
            # its host time is no part of the candidate's calls (the reference has none).
            outs, inner, gated = gated_calls(w, state, cache, model, inputs, inside, snap_in, k)
            foreign_mark(cand, state, watch, False)
            ms = finish_sample(w, gated, n)
        else:
            flush(w, state, cache, k)
            t0 = _perf_counter_ns()
            outs, inner = _call_all(model, inputs, inside, snap_in)
            t1 = _perf_counter_ns()
            foreign_mark(cand, state, watch, False)
            ms = (t1 - t0) / 1e6 / n
            state.host_ms = ms
            ms = (ms, ms)
        picks = check_indices(w, n, checked)
        snaps = [(i, snapshot(w, checks, outs[i]), False) for i in picks]
        nbytes = _min(_output_bytes(outs[i]) for i in picks)
        snaps.extend((i, snap, True) for i, snap in inner)
        aliased = [_aliased_outputs(out, x) for out, x in zip(outs, inputs)]
        storages = [_output_storages(out) for out in outs]
    except _BaseException as e:
        raise _error_done(e, f"in ModelNew.forward ({where})") from None
    del outs
    after_call(w, py0, os0, where, True)
    for a in aliased:
        check_aliasing(ref, a, where)
    return ms, (snaps, storages), nbytes


def check_indices(w, n, checked):
    """`checked` distinct call indices of a sample of `n` calls, drawn from the harness's
    generator (all of them when n <= checked)."""
    if n <= checked:
        return _list(_range(n))
    picks = _set()
    while _len(picks) < checked:
        picks.add(_int(w.rng_random() * n))
    return _sorted(picks)


def foreign_mark(cand, state, watch, outside):
    """Threads the candidate started in its first calls (any OS thread not there before
    trial 0) may work inside its calls only. Called as a candidate call of the timing rounds
    starts (outside=True: the span since the last mark was outside the candidate's calls,
    where the harness and the reference ran) and as its forward returns (outside=False, only
    the known threads' clocks: nothing is added to the call's time where there are none).
    A thread that gained CPU time outside the calls, or began or ended there, marks the
    round: such a thread could load the device or the cores while the reference is timed,
    or launch work after the candidate's clock stopped (runtime:threads, check_foreign)."""
    if cand.thread_base is None:
        return
    prev = watch.foreign
    if outside or prev is None:
        tids = _tids()
        if tids is None:
            return
        now = {}
        for tid in tids - cand.thread_base:
            ns = _thread_cpu_ns(tid)
            if ns is not None:
                now[tid] = ns
    else:
        now = {}
        for tid in prev:
            ns = _thread_cpu_ns(tid)
            if ns is not None:
                now[tid] = ns
    watch.foreign = now
    if prev is None or not outside:
        return
    ran = 0
    changed = _len(now) != _len(prev)
    for tid, ns in now.items():
        if tid in prev:
            ran += ns - prev[tid]
        else:
            changed = True
            ran += ns
    if ran > 0 or changed:
        watch.foreign_rounds.add(_max(state.round_no - 1, 0))  # the first calls count with round 0
        watch.foreign_ns += ran


def check_foreign(w, watch, rounds):
    """runtime:threads when threads of the candidate ran outside its calls in two or more of
    the timing rounds so far (one is let pass: a thread finishing what it began in the first
    calls). `rounds`: how many rounds have begun."""
    if watch.foreign_rounds:
        w.laps["timing: rounds with foreign thread activity"] = _len(watch.foreign_rounds)
        w.laps["timing: foreign thread CPU (us)"] = watch.foreign_ns / 1e3
    if _len(watch.foreign_rounds) >= 2:
        raise _Done("rejected", ["runtime:threads"],
                    f"a thread the candidate started in its first calls ran outside its calls, while the "
                    f"harness and the reference ran, in {_len(watch.foreign_rounds)} of {rounds} timing rounds "
                    f"({watch.foreign_ns / 1e3:.0f} us of CPU time); a candidate's threads may only work "
                    "inside its own calls")


def snapshot_inside(w, checks):
    """The snapshot taken inside a timed sample (_call_all, after every call but the last):
    snapshot() of _INSIDE_SAMPLE elements of each output. Made before the sample's clock starts;
    the reference's sample and the candidate's take the same one."""
    return lambda out: snapshot(w, checks, out, _INSIDE_SAMPLE)


def snapshot(w, checks, out, samples=_ROUND_SAMPLE):
    """The outputs of a timed call as they are when its clock stops, taken before anything
    else the harness does: for each plain tensor output, its values at up to _ROUND_SAMPLE
    positions drawn now, after the call, from a generator the candidate cannot reach (on
    CUDA, a gather queued on the timing stream right after the device-wide synchronisation).
    Work that a thread of the candidate finishes after the call returned, unseen by the
    clock, is missing from the snapshot. Returns one entry per output (_output_items): the
    output itself where it is not a plain tensor, else a _Taken."""
    snap = []
    kernels = _kernels()
    for y in _output_items(out):
        if _type(y) is not _Tensor:
            snap.append(y)
            continue
        n = _T_numel(y)
        size = _tuple(_T_size(y))
        if n == 0:
            snap.append(_Taken(None, None, size, y.dtype))
            continue
        if kernels is not None and y.device.type == "cuda" and kernels.supports(y):
            seed = checks.sample_bits(64)
            yc = y if _T_is_contiguous(y) else _T_contiguous(y)
            snap.append(_Taken(kernels.gather(yc, seed, samples), seed, size, y.dtype))
            continue
        ys = _T_reshape(_T_detach(y), (-1,))
        if n > samples and samples < _ROUND_SAMPLE:
            # Inside a sample, without the harness kernels (the CPU): a window of `samples`
            # elements at a random place, one copy. Drawing positions and gathering them cost
            # as much as a small call, and their varying cost inside both samples widened the
            # CPU suite's bands from about ±10% to ±25-57%. A call that left its outputs
            # unwritten, or any part of them, is caught where the window falls on it.
            start = _int(w.rng_random() * (n - samples + 1))
            where = slice(start, start + samples)
            snap.append(_Taken(_T_clone(ys[where]), where, size, y.dtype))
            continue
        if n > samples:
            idx = _torch_randint(0, n, (samples,), generator=checks.sample_gen, device=y.device)
            snap.append(_Taken(_torch_index_select(ys, 0, idx), idx, size, y.dtype))
        else:
            snap.append(_Taken(_T_clone(ys), None, size, y.dtype))
    return snap


def check_round_outputs(w, job, state, checks, ref_out, snap, k):
    """Every timed call's outputs are held to the correctness tolerance against the
    reference's on the same inputs (a candidate that computes less, or in lower precision,
    only when it is timed fails here: runtime:timing_outputs). `snap` is the candidate's
    snapshot (snapshot()): outputs larger than _ROUND_SAMPLE elements are compared at that
    many positions drawn after the call, so the candidate cannot know which elements are
    checked; comparing every element in float64 took longer than the timed calls themselves.

    Type, shape and dtype are checked here; the count of differing elements is computed on
    the device and kept (checks.round_fracs), and read once per measurement by
    check_round_fracs(): reading it every round waited for the device each time."""
    a = _output_items(ref_out)
    bad = _len(a) != _len(snap)
    detail = "a different number of outputs"
    for i, (x, y) in _enumerate(zip(a, snap)):
        if bad:
            break
        if _type(y) is not _Taken or _type(x) is not _Tensor:
            bad = _type(x) is not _type(y) or _type(x) is _Tensor
            detail = "an output of another type"
            continue
        taken, where, size, dtype = y.values, y.where, y.size, y.dtype
        if x.dtype != dtype or _tuple(_T_size(x)) != size:
            bad, detail = True, "an output of another shape or dtype"
            continue
        if taken is None:
            continue
        if _type(where) is _int:
            check_round_output_kernels(w, job, state, checks, i, x, taken, where, k)
            continue
        xs = _T_reshape(x, (-1,))
        if _type(where) is slice:
            xs = xs[where]
        elif where is not None:
            xs = _torch_index_select(xs, 0, where)
        if _T_is_floating_point(xs):
            # |y - x| <= atol + rtol * |x| in float64, NaN matching NaN (env/eval/compare.cpp).
            atol, rtol = tolerance(job, state, x.dtype, i)
            ok = _torch_isclose(_T_to(taken, torch.float64), _T_to(xs, torch.float64), rtol=rtol, atol=atol,
                                equal_nan=True)
        else:
            ok = _torch_eq(xs, taken)
        checks.round_fracs.append((k, i, _T_numel(ok), _torch_count_nonzero(ok)))
    if bad:
        round_failed(k, detail)


def check_round_output_kernels(w, job, state, checks, i, x, taken, seed, k):
    """check_round_outputs for one output with the harness's own kernels: the reference's
    values at the positions drawn from `seed` against the candidate's snapshot, the same
    tolerance, and the mismatches counted into a slot of checks.round_bad (read by
    check_round_fracs)."""
    if not _T_is_contiguous(x):
        x = _T_contiguous(x)
    atol, rtol = tolerance(job, state, x.dtype, i)
    if checks.round_used == _ROUND_SLOTS:
        check_round_fracs(w, checks)
    slot = checks.round_used
    checks.round_used += 1
    # The snapshot's size says how many positions it drew (all of them, in order, when the
    # output had no more elements than that).
    samples = _T_numel(taken)
    _kernels().round_check(x, taken, seed, samples, atol, rtol, _T_data_ptr(checks.round_bad) + 8 * slot)
    checks.round_fracs.append((k, i, samples, slot))


def tolerance(job, state, dtype, i):
    """(atol, rtol) of the correctness comparison for output `i`, of `dtype` (env/eval/compare.cpp:
    exact for the dtypes it names no tolerance for), atol widened by the reference's own
    rounding error on that output (round_slack) as the evaluator widens it for the trials."""
    atol, rtol = job.tolerances.get(dtype, (0.0, 0.0))
    if i < _len(state.cur_slack) and (atol > 0 or rtol > 0):
        atol += state.cur_slack[i]
    return atol, rtol


def round_failed(k, detail):
    raise _Done("rejected", ["runtime:timing_outputs"],
                f"timing round {k}: the candidate's output differs from the reference's on the same "
                f"inputs ({detail}); every timed call is checked like a correctness trial")


def check_round_fracs(w, checks):
    """The kept counts of differing elements (check_round_outputs), read in one transfer."""
    fracs = checks.round_fracs
    checks.round_fracs = []
    if not fracs:
        return
    counted = [m for _, _, _, m in fracs if _type(m) is not _int]
    matching = _T_tolist(_torch_stack(counted)) if counted else []
    kernels = _kernels()
    used = checks.round_used if kernels is not None and w.kind.harness_kernels else 0
    mismatches = _T_tolist(checks.round_bad[:used]) if used else []
    if used:
        kernels._zero(_T_data_ptr(checks.round_bad), used * 8)
        checks.round_used = 0
    it = iter(matching)
    for k, i, n, m in fracs:
        bad = mismatches[m] if _type(m) is _int else n - next(it)
        if bad > 0:
            round_failed(k, f"{bad} of {n} checked elements of output {i} beyond the correctness tolerance")


def prime_reference(w, job, baseline, inputs):
    """An untimed call of the reference right before its timed sample (see timing()),
    waited for like the candidate's (whose side-stream work would otherwise be counted in
    its sample). When nothing waited for it, the host queued the reference's timed calls
    while the device still ran the priming call, so a reference of many small kernels was
    timed without the host's launch gaps that the candidate's sample paid: identical code
    came out slower as the candidate."""
    try:
        if job.baseline == "cuda-graph":
            baseline.graph[0].replay()
        else:
            if baseline.mark_step is not None:
                baseline.mark_step()
            out = baseline.fn(*inputs)
            del out
        w.sync()
    except _BaseException as e:
        raise _error_done(e, "in the reference during timing") from None


def prime_candidate(w, cand, state, watch, inputs, where):
    """The candidate's untimed call right before its timed sample (see prime_reference), with the
    checks after every candidate call and the thread watch's marks (foreign_mark)."""
    out, _ = call_candidate(w, cand, inputs, where + ", untimed priming call",
                            mark=lambda outside: foreign_mark(cand, state, watch, outside))
    del out


def one_round(w, job, ref, baseline, cand, state, checks, watch, cache):
    """One paired round: each model timed once, in random order, on a sample of state.calls
    calls, each call on its own fresh inputs; returns ((synced, stream) ms per call of the
    reference, the same of the candidate, candidate first)."""
    k = state.round_no
    state.round_no += 1
    t_round = _perf_counter_ns()
    n = state.calls
    # Fresh values at fresh addresses: the previous round's inputs are still alive while
    # these are generated, outside the timed region; each model gets its own copy.
    # Seeded from the operating system, drawn now: no state of this process predicts them.
    # Every call of a sample has its own: no call can reuse another's work.
    dist = ref.dists[k % _len(ref.dists)]
    fresh = [make_inputs(ref.task, w.device, _fresh_seed(), dist) for _ in _range(n)]
    # The slack of this distribution's trials; the largest of all where no trial drew it.
    slack = ref.round_slack
    state.cur_slack = slack.get(dist) or [_max(v) for v in zip(*slack.values())]
    if job.jitter_bytes >= 512:  # both copies at random places (docs/evaluator.md, Timing: placement)
        # A sample's calls share the jitter: n leads of up to jitter / n bytes each.
        jitter = job.jitter_bytes // n
        ref_in = [_placed(x, jitter, w.rng_random) for x in fresh]
        cand_in = [_placed(x, jitter, w.rng_random) for x in fresh]
    else:
        ref_in = fresh
        cand_in = [_clone_inputs(x) for x in fresh]
    for x in cand_in[0]:
        if _isinstance(x, _Tensor):
            state.placements.add(_T_data_ptr(x))
            break
    prev_ref, prev_cand = state.prime_inputs
    # Order in balanced pairs: a random order, then the other one. Some pairs showed a
    # steady order effect (on an H100, layernorm's per-round ratio alternated 5.4x/5.6x by
    # order); with independent coin flips a bucket of rounds holds an uneven mix and its mean
    # moves with it, while a bucket of whole pairs holds both orders equally.
    if state.pair_first is None:
        cand_goes_first = w.rng_random() < 0.5
        state.pair_first = cand_goes_first
    else:
        cand_goes_first = not state.pair_first
        state.pair_first = None
    where = f"timing round {k}"
    # Every call but the last is snapshotted inside both samples (timed_candidate).
    inside = n > 1
    t0 = w.lap("round: inputs", t_round)
    # Each timed sample directly follows an untimed call of the same model on the previous
    # round's inputs. Without it, whichever call came first in a round ran 8-15% slower
    # (host-side state after generating the inputs; measured on an H100), which random
    # order turned into +-10% of noise on the speedup.
    if cand_goes_first:
        prime_candidate(w, cand, state, watch, prev_cand, where)
        t0 = w.lap("round: candidate priming", t0)
        c_ms, c_out, c_bytes = timed_candidate(w, ref, cand, state, checks, watch, cache, cand_in, 2 * k, where,
                                               _ROUND_CHECKS, inside)
        t0 = w.lap("round: candidate timed", t0)
        prime_reference(w, job, baseline, prev_ref)
        t0 = w.lap("round: reference priming", t0)
        r_ms, r_outs = timed_reference(w, job, baseline, state, checks, cache, ref_in, 2 * k + 1, inside)
        t0 = w.lap("round: reference timed", t0)
    else:
        prime_reference(w, job, baseline, prev_ref)
        t0 = w.lap("round: reference priming", t0)
        r_ms, r_outs = timed_reference(w, job, baseline, state, checks, cache, ref_in, 2 * k, inside)
        t0 = w.lap("round: reference timed", t0)
        prime_candidate(w, cand, state, watch, prev_cand, where)
        t0 = w.lap("round: candidate priming", t0)
        c_ms, c_out, c_bytes = timed_candidate(w, ref, cand, state, checks, watch, cache, cand_in, 2 * k + 1,
                                               where, _ROUND_CHECKS, inside)
        t0 = w.lap("round: candidate timed", t0)
    # The floor counts the outputs of checked calls only (the other calls' outputs are not).
    state.floor_bytes = c_bytes if state.floor_bytes is None else _min(state.floor_bytes, c_bytes)
    snaps, storages = c_out
    try:
        for i, snap, in_sample in snaps:
            ref_out = _output_items(r_outs[i]) if in_sample else _checked_reference(r_outs, storages, i)
            check_round_outputs(w, job, state, checks, ref_out, snap, k)
    except _Done:
        raise
    except _BaseException as e:
        raise _error_done(e, f"comparing the outputs of {where}") from None
    t0 = w.lap("round: output check", t0)
    del r_outs, c_out, snaps
    # Kept alive until the next round's inputs exist (fresh addresses), and used for the
    # next round's priming calls.
    state.prime_inputs = (ref_in[-1], cand_in[-1])
    del fresh, ref_in, cand_in, prev_ref, prev_cand
    w.lap("round: previous inputs freed", t0)
    return r_ms, c_ms, cand_goes_first


def choose_calls(w, job, ref_ms, cand_ms, in_bytes, out_bytes, inputs_ms, host_ms=0.0):
    """Calls per timed sample: as many as make the faster model's sample last
    job.sample_ms, at most job.max_calls; fewer where a round's inputs and outputs for
    both models would take more than a quarter of the device's free memory (1 GiB on the
    CPU) or drawing the inputs more than _INPUTS_MS_PER_ROUND of host time; one with sample_ms
    0 and with the graph baselines: cuda-graph copies its static inputs before each replay,
    and compile-reduce-overhead's graphs overwrite their outputs at the next step, where a
    sample keeps every call's outputs. `ref_ms`, `cand_ms`: the first calls' stream times."""
    if job.sample_ms <= 0 or job.baseline in ("cuda-graph", "compile-reduce-overhead"):
        return 1
    fastest = _max(_min(_sorted(ref_ms)[_len(ref_ms) // 2], _sorted(cand_ms)[_len(cand_ms) // 2]), 1e-6)
    calls = _min(job.max_calls, _max(1, _int(-(-job.sample_ms // fastest))))
    per_call = _max(2 * (in_bytes + out_bytes), 1)
    budget = 1 << 30
    if w.kind.memory_info:
        try:
            budget = torch.cuda.mem_get_info()[0] // 4
        except _BaseException:
            pass
    calls = _min(calls, _max(1, budget // per_call))
    if inputs_ms > 0:
        calls = _min(calls, _max(1, _int(_INPUTS_MS_PER_ROUND // inputs_ms)))
    if w.kind.device_clock and host_ms > 0:  # the host queues a sample well within the gate's wait
        calls = _min(calls, _max(1, _int(_GATE_HOST_MS // host_ms)))
    return calls


def clock_warmup(w, state, cap_ms):
    """CUDA: keeps the device busy with spin kernels until its SM clock stops rising (for at
    most cap_ms), and logs the clock reached. A spin of C cycles takes C / f, so each batch's
    elapsed time gives the clock f. The paired rounds keep the device busy only part of the
    time, so they alone may leave a clock low after idle seconds. (It did not remove the
    1.5-2.5% slower first verdicts of a 0.26 ms kernel on an H100, which it was tried for: the
    clock was already at 1938 of 1980 MHz there.) Settled: a batch no more than 0.5% faster
    than the fastest before it, after at least _CLOCK_MIN_MS of spinning."""
    if not w.kind.device_clock or not state.can_spin:
        return
    t0 = _perf_counter_ns()
    best = 0.0
    spun = 0.0
    batches = 0
    while True:
        _Ev_record(w.ev0, w.stream0)
        for _ in _range(_CLOCK_BATCH):
            spin(_LAUNCH_COVER_CYCLES)
        _Ev_record(w.ev1, w.stream0)
        _Ev_synchronize(w.ev1)
        ms = _Ev_elapsed(w.ev0, w.ev1)
        spun += ms
        batches += 1
        mhz = _CLOCK_BATCH * _LAUNCH_COVER_CYCLES / (ms * 1e3) if ms > 0 else 0.0
        if spun >= _CLOCK_MIN_MS and mhz <= best * 1.005:
            break
        best = _max(best, mhz)
        if (_perf_counter_ns() - t0) >= cap_ms * 1e6:
            break
    w.laps["timing: clock warm-up batches"] = w.laps.get("timing: clock warm-up batches", 0) + batches
    w.laps["timing: SM clock after warm-up (MHz)"] = mhz


def await_measure(w, state):
    """Says the warm-up is over and waits for the evaluator's word to begin the measured
    rounds (it lets starting workers' context creations finish first; docs/evaluator.md,
    Timing). On CUDA the device spins meanwhile, so that its clocks stay up."""
    t0 = _perf_counter_ns()
    w.chan.send({"type": "warmed"})
    if w.kind.device_clock and state.can_spin:
        msg = None
        while msg is None:
            for _ in _range(5):
                spin(_LAUNCH_COVER_CYCLES)
            _cuda_synchronize()
            msg = w.chan.poll()
    else:
        msg = w.chan.recv()
    if msg.get("type") == "stop":
        _os_exit(0)
    if msg.get("type") != "measure":
        raise _Done("runtime_error", (), f"expected measure, got {msg.get('type')!r}")
    w.lap("timing: waiting to measure", t0)


def reserve_for_rounds(w, job, inputs):
    """CUDA: one allocation for the timing rounds' buffers, handed back to torch's caching
    allocator at once. Each round copies its inputs into blocks of their size plus a random
    lead; blocks the trials left behind are too small for those, so without it each new size
    asked the driver for memory, in the first rounds above all and sometimes inside a timed
    call. Blocks cut from one large free block need no driver call."""
    t0 = _perf_counter_ns()
    nbytes = _sum(_int(_T_numel(t)) * t.element_size() for t in _tensors_in(inputs))
    want = 8 * nbytes + 4 * job.jitter_bytes
    try:
        free, _total = torch.cuda.mem_get_info()
        want = _min(want, free // 2)
        if want >= (64 << 20):
            block = _torch_empty(want, dtype=_uint8, device="cuda")
            del block
    except _BaseException:
        pass  # an optimisation only: the rounds then allocate as they go
    w.laps["timing: reserved MiB"] = want / (1 << 20)
    w.lap("timing: reserve", t0)


def measure_floor(w, state, cache):
    """The physics floor of a timed call (KernelGuard's): half the fastest of five fills of
    as many bytes as the candidate's outputs held (_output_bytes; the fewest of its calls in
    the rounds so far, whose outputs are all checked), timed as a timed call is (after the
    cache flush and, on CUDA, from the start event on the timing stream to the event after
    the fill). No call can produce its outputs faster than the device writes them, nor in
    less than one launch, which the fill also takes; the half leaves room for a fill slower
    than the best possible writes. Measured once, after the first measured rounds; sent
    with every measurement, and the evaluator compares the candidate's median settled time
    with it (runtime:below_floor, env/eval/evaluator.cpp)."""
    t0 = _perf_counter_ns()
    nbytes = _max(_int(state.floor_bytes or 0), 1)
    buf = _torch_empty(nbytes, dtype=_uint8, device=w.device)
    best = None
    n = state.calls  # fills back to back, as many as a timed sample's calls
    kernels = _kernels()

    def fill():
        if kernels is not None:
            kernels._zero(_T_data_ptr(buf), nbytes)
        else:
            _T_zero_(buf)

    for i in _range(5):
        if w.kind.device_clock:
            # The fills behind the gate, back to back, as a sample's calls are.
            _, _, gated = gated_calls(w, state, cache, fill, [()] * n, False, None, -10 - i)
            _Ev_synchronize(w.ev_call)
            gate_outcome(w, gated)
            ms = _Ev_elapsed(w.ev0, w.ev_call) / n
        else:
            flush(w, state, cache, -10 - i)
            t1 = _perf_counter_ns()
            for _ in _range(n):
                fill()
            ms = (_perf_counter_ns() - t1) / 1e6 / n
        best = ms if best is None else _min(best, ms)
    del buf
    state.floor_ms = 0.5 * best
    w.laps["timing: floor (us)"] = state.floor_ms * 1e3
    w.laps["timing: floor bytes"] = nbytes
    w.lap("timing: floor", t0)


def timing(w, job, ref, baseline, cand, state, checks, watch, cache, rounds, warmup_ms, warmup_rounds=3,
           announce=False):
    """The timing phase at one `time` message, on worker `w` (its device, events, laps, channel
    and generator): warm-up and `rounds` measured rounds (timing_rounds) of the reference
    (`baseline`) and the candidate (`cand`) on fresh inputs drawn as `ref` says, with the state
    kept across `time` messages (`state`, `checks`, `watch`) and the cache flush's buffer
    (`cache`), and the cyclic garbage collector off under evaluator.quiet_gc. Returns the
    `timing` message's fields."""
    collecting = job.quiet_gc and _gc_isenabled()
    if collecting:
        _gc_disable()
    w.timing_now = True
    try:
        return timing_rounds(w, job, ref, baseline, cand, state, checks, watch, cache, rounds, warmup_ms,
                             warmup_rounds, announce)
    finally:
        w.timing_now = False
        if collecting:
            _gc_enable()


def timing_rounds(w, job, ref, baseline, cand, state, checks, watch, cache, rounds, warmup_ms, warmup_rounds,
                  announce):
    t_first = _perf_counter_ns()
    watch.foreign = None  # the first mark starts the watch (foreign_mark)
    clocked = False  # the clock warm-up ran in this call
    if not state.warmed:
        t_in = _perf_counter_ns()
        inputs = make_inputs(ref.task, w.device, job.seed + 6_000_001, 0)
        placed = _placed(inputs, job.jitter_bytes, w.rng_random)
        inputs_ms = (_perf_counter_ns() - t_in) / 1e6  # what one call's inputs cost to draw and place
        del placed
        if w.kind.memory_info and job.timing_reserve:
            reserve_for_rounds(w, job, inputs)
        ref_first, cand_first = [], []
        out_bytes = 0
        host_first = []
        if warmup_ms > 0:  # the first calls' times choose the calls per sample: clocks up first
            clock_warmup(w, state, warmup_ms)
            clocked = True
        for i in _range(3):
            ms, out, nbytes = timed_candidate(w, ref, cand, state, checks, watch, cache, [_clone_inputs(inputs)],
                                              -1 - i, f"warm-up call {i}")
            cand_first.append(ms[1])
            host_first.append(state.host_ms)
            out_bytes = _max(out_bytes, nbytes)
            del out
            ms, out = timed_reference(w, job, baseline, state, checks, cache, [_clone_inputs(inputs)], -1 - i)
            ref_first.append(ms[1])
            host_first.append(state.host_ms)
            del out
        in_bytes = _sum(_int(_T_numel(t)) * t.element_size() for t in _tensors_in(inputs))
        # The slower model's median host time per call (the first call of each may be slow).
        host_ms = _max(_sorted(host_first[0::2])[1], _sorted(host_first[1::2])[1])
        state.calls = choose_calls(w, job, ref_first, cand_first, in_bytes, out_bytes, inputs_ms, host_ms)
        w.laps["timing: first calls' host time per call (ms)"] = host_ms
        w.laps["timing: calls per sample"] = state.calls
        w.laps["timing: first calls' inputs (ms)"] = inputs_ms
        state.prime_inputs = (inputs, _clone_inputs(inputs))
        del inputs
        state.warmed = True
        w.lap("timing: first calls", t_first)
    # Warm-up rounds, untimed, until both models' times have settled, for at most warmup_ms:
    # after idle seconds a GPU's clocks are low, and on an H200 the first ~12 rounds ran up
    # to 30% slower, which decided whole verdicts. While the clocks rise, each round is
    # faster than the ones before; settled means the median of the last three rounds is
    # within _WARMUP_SETTLED of the fastest warm-up round so far, for both models.
    t0 = _perf_counter_ns()
    if warmup_ms > 0 and not clocked:  # not again right after the first calls' warm-up
        clock_warmup(w, state, warmup_ms)
    n = 0
    ref_seen, cand_seen = [], []
    while n < warmup_rounds or (warmup_ms > 0 and not (_settled(ref_seen) and _settled(cand_seen))
                                and (_perf_counter_ns() - t0) < warmup_ms * 1e6):
        r_ms, c_ms, _ = one_round(w, job, ref, baseline, cand, state, checks, watch, cache)
        n += 1
        ref_seen.append(r_ms[1])
        cand_seen.append(c_ms[1])
    check_round_fracs(w, checks)
    check_foreign(w, watch, state.round_no)
    w.lap("timing: warm-up rounds", t0)
    w.laps["timing: warm-up round count"] = w.laps.get("timing: warm-up round count", 0) + n
    if announce:
        await_measure(w, state)
        watch.foreign = None  # waiting for the evaluator's word is not a round
    t0 = _perf_counter_ns()
    state.pair_first = None  # measured rounds start a pair
    ref_ms, cand_ms, ref_stream_ms, cand_stream_ms, first = [], [], [], [], []
    for _ in _range(rounds):
        r_ms, c_ms, cand_goes_first = one_round(w, job, ref, baseline, cand, state, checks, watch, cache)
        ref_ms.append(_float(r_ms[0]))
        ref_stream_ms.append(_float(r_ms[1]))
        cand_ms.append(_float(c_ms[0]))
        cand_stream_ms.append(_float(c_ms[1]))
        first.append(_bool(cand_goes_first))
    check_round_fracs(w, checks)
    check_foreign(w, watch, state.round_no)
    w.lap("timing: measured rounds", t0)
    if state.floor_ms is None:
        measure_floor(w, state, cache)
    w.laps["timing: measured round count"] = w.laps.get("timing: measured round count", 0) + rounds
    w.laps["timing: distinct candidate input addresses"] = _len(state.placements)
    return {"ref_ms": ref_ms, "cand_ms": cand_ms, "ref_stream_ms": ref_stream_ms,
            "cand_stream_ms": cand_stream_ms, "cand_first": first, "floor_ms": state.floor_ms,
            "calls": state.calls,
            "floor_bytes": w.laps.get("timing: floor bytes", 0)}


def _settled(times):
    """The median of the last three times is within _WARMUP_SETTLED of the smallest so far."""
    if _len(times) < 3:
        return False
    last = _sorted(times[-3:])[1]
    return last <= (1.0 + _WARMUP_SETTLED) * _min(times)
