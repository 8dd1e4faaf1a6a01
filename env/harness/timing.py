"""env/harness/timing.py: the timing phase of a job (Worker.timing, at each `time` message after
the trials): paired rounds of timed samples of the reference and the candidate on fresh inputs,
behind the cache flush and (CUDA) the gate, every timed call's outputs snapshotted as its clock
stops and checked against the reference's, the threads the candidate started watched, and the
physics floor measured; the times go back to the evaluator, which settles them. Worker
(worker.py) takes these methods from _TimingPhase; the state they keep across `time` messages is
data: TimingState, RoundChecks and ThreadWatch."""
import torch

from .trusted import (
    _BaseException, _bool, _cuda_sleep, _cuda_synchronize, _enumerate, _Ev_elapsed, _Ev_record, _Ev_synchronize,
    _float, _fresh_seed, _gc_disable, _gc_enable, _gc_isenabled, _int, _int64, _isinstance, _len, _list, _max,
    _min, _os_exit, _perf_counter_ns, _range, _reseed_visible, _set, _sorted, _sum, _T_clone, _T_contiguous,
    _T_copy_, _T_data_ptr, _T_detach, _T_is_contiguous, _T_is_floating_point, _T_numel, _T_reshape, _T_set_,
    _T_size, _T_stride, _T_to, _T_tolist, _T_untyped_storage, _T_zero_, _Tensor, _torch_count_nonzero,
    _torch_empty, _torch_eq, _torch_index_select, _torch_isclose, _torch_randint, _torch_stack, _torch_sum,
    _tuple, _type, _uint8
)
from .device import _kernels
from .channel import _Done, _error_done
from .reference import make_inputs
from .outputs import (
    _aliased_outputs, _call_all, _checked_reference, _clone_inputs, _map_tensors, _os_threads, _output_bytes,
    _output_items, _output_storages, _py_threads, _Taken, _tensors_in, _thread_cpu_ns, _tids
)

# Device-side spin queued after the cache flush, before the start event: ~100 us at 2 GHz. The
# host launches the timed call while the device is still busy with the flush and the spin, so
# the start event is passed when the call's first kernel can start: the host's launch latency
# (10-40 us, varying from process to process) stays out of the stream time.
_LAUNCH_COVER_CYCLES = 200_000
# Clock warm-up (Worker.clock_warmup): spins per timed batch, and the least time spent spinning.
_CLOCK_BATCH = 40
_CLOCK_MIN_MS = 20.0
# Elements of each output compared in every timing round (check_round_outputs).
_ROUND_SAMPLE = 1 << 16
# Elements of each output snapshotted inside a timed sample, after every call but the last
# (_call_all): enough to catch a call that left its outputs unwritten or unfinished, few enough
# that the gather, which both samples hold, adds little to a 10 us call.
_INSIDE_SAMPLE = 1 << 12
# How long the gate before a timed sample (Worker.begin_sample) waits at most for the host to
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
    """The timing phase's rounds across the job's `time` messages (made by Worker.run).

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


class _TimingPhase:
    """The timing phase's methods of Worker."""

    # -- cache flush, spin and gate ------------------------------------------------------------
    def spin(self, cycles):
        """CUDA: keeps the device busy for `cycles` SM clock cycles (one thread)."""
        kernels = _kernels()
        if kernels is not None:
            kernels.spin(cycles)
        else:
            _cuda_sleep(cycles)

    def flush(self, k, cover=True):
        """Evict caches by reading flush_bytes of a scratch buffer (L2 on CUDA, LLC on CPU).
        Reading leaves clean lines behind: after a write-based flush the timed call paid for
        writing the flush's dirty lines back, a fixed cost that pulled every speedup toward 1.
        CUDA: nothing waits for it; with `cover` a spin follows on the stream (see
        _LAUNCH_COVER_CYCLES), and the caller records the start event and makes the call while
        the device works through both (a timed sample closes the gate instead: begin_sample)."""
        kernels = _kernels()
        if kernels is not None and self.cuda:
            kernels.flush(self.flush_buf)
        else:
            _torch_sum(self.flush_buf, 0, dtype=_int64, out=self.flush_sum)
        if cover and self.cuda and self.rounds.can_spin:
            self.spin(_LAUNCH_COVER_CYCLES)

    def begin_sample(self, k):
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
        self.flush(k, cover=kernels is None)
        if kernels is None:
            return False
        kernels.gate_close(_GATE_CYCLES)
        return True

    def gated_calls(self, fn, inputs, inside, k):
        """CUDA: a timed sample's calls (_call_all) between the start event and the stream's stop
        event, behind the gate (begin_sample), which is opened however they end. The reference's
        sample and the candidate's run this same code. Returns (outputs, in-sample snapshots,
        whether the gate was closed); the caller waits for the device and reads the times."""
        gated = self.begin_sample(k)
        _Ev_record(self.ev0, self.stream0)
        try:
            t_host = _perf_counter_ns()
            outs, inner = _call_all(fn, inputs, inside, self.snapshot_inside)
            _Ev_record(self.ev_call, self.stream0)
            self.rounds.host_ms = (_perf_counter_ns() - t_host) / 1e6 / _len(inputs)
        finally:
            self.end_sample(gated)
        return outs, inner, gated

    def finish_sample(self, gated, n):
        """CUDA, after gated_calls: waits for the whole device (work on side streams counts),
        records the stop event after it, counts a gate timeout, and returns the (synced, stream)
        milliseconds per call of the `n` calls (elapsed)."""
        _cuda_synchronize()
        _Ev_record(self.ev1, self.stream0)
        _Ev_synchronize(self.ev1)
        self.gate_outcome(gated)
        return self.elapsed(n)

    def end_sample(self, gated):
        if gated:
            _kernels().gate_open()

    def gate_outcome(self, gated):
        """After the device was waited for: counts a gate that stopped waiting before the host
        opened it (`timing: gate timeouts` in --verbose's laps)."""
        if gated and _kernels().gate_timed_out():
            self.laps["timing: gate timeouts"] = self.laps.get("timing: gate timeouts", 0) + 1

    # -- timed samples and rounds --------------------------------------------------------------
    def timed_reference(self, inputs, k, inside=False):
        """One timed sample of the reference: a call on each entry of `inputs` (a list of input
        lists), back to back between one start and one stop; with `inside`, the same snapshots as
        the candidate's in-sample ones are taken after every call but the last and dropped, so
        that both samples hold the same work. Returns ((synced, stream) ms per call, the list of
        the calls' outputs)."""
        n = _len(inputs)
        try:
            fn = self.baseline.fn
            static_out = None
            if self.job.baseline == "cuda-graph":  # one call per sample (choose_calls)
                graph, static, static_out = self.baseline.graph
                for s, x in zip(static, inputs[0]):
                    if _isinstance(s, _Tensor):
                        _T_copy_(s, x)
                fn, inputs = graph.replay, [()]
            elif self.job.baseline == "compile-reduce-overhead" and self.baseline.mark_step is not None:
                self.baseline.mark_step()  # one call per sample with this baseline (choose_calls)
            if self.cuda:
                outs, _, gated = self.gated_calls(fn, inputs, inside, k)
                ms = self.finish_sample(gated, n)
                return ms, ([static_out] if static_out is not None else outs)
            self.flush(k)
            t0 = _perf_counter_ns()
            outs, _ = _call_all(fn, inputs, inside, self.snapshot_inside)
            t1 = _perf_counter_ns()
            ms = (t1 - t0) / 1e6 / n
            self.rounds.host_ms = ms
            return (ms, ms), outs
        except _BaseException as e:
            raise _error_done(e, "in the reference during timing") from None

    def elapsed(self, n):
        """(synced, stream) milliseconds per call of the `n` calls just timed: from the start
        event to the stop event recorded after the device-wide synchronisation, and to the event
        recorded on the stream right after the last call returned, each divided by `n`. The
        evaluator settles the pair (env/timing.hpp, settle_rounds): the first counts every stream
        but also the host's wake-up after the synchronisation, which differs from process to
        process."""
        return _Ev_elapsed(self.ev0, self.ev1) / n, _Ev_elapsed(self.ev0, self.ev_call) / n

    def timed_candidate(self, inputs, k, where, checked=1, inside=False):
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
        model = self.candidate.model
        n = _len(inputs)
        py0 = _py_threads()
        os0 = _os_threads()
        _reseed_visible()
        self.candidate_flags()
        self.foreign_mark(True)
        try:
            if self.cuda:
                # The stream's stop comes before the harness's own bookkeeping (the thread watch):
                # its host time is no part of the candidate's calls (the reference has none).
                outs, inner, gated = self.gated_calls(model, inputs, inside, k)
                self.foreign_mark(False)
                ms = self.finish_sample(gated, n)
            else:
                self.flush(k)
                t0 = _perf_counter_ns()
                outs, inner = _call_all(model, inputs, inside, self.snapshot_inside)
                t1 = _perf_counter_ns()
                self.foreign_mark(False)
                ms = (t1 - t0) / 1e6 / n
                self.rounds.host_ms = ms
                ms = (ms, ms)
            picks = self.check_indices(n, checked)
            snaps = [(i, self.snapshot(outs[i]), False) for i in picks]
            nbytes = _min(_output_bytes(outs[i]) for i in picks)
            snaps.extend((i, snap, True) for i, snap in inner)
            aliased = [_aliased_outputs(out, x) for out, x in zip(outs, inputs)]
            storages = [_output_storages(out) for out in outs]
        except _BaseException as e:
            raise _error_done(e, f"in ModelNew.forward ({where})") from None
        del outs
        self.after_call(py0, os0, where, True)
        for a in aliased:
            self.check_aliasing(a, where)
        return ms, (snaps, storages), nbytes

    def check_indices(self, n, checked):
        """`checked` distinct call indices of a sample of `n` calls, drawn from the harness's
        generator (all of them when n <= checked)."""
        if n <= checked:
            return _list(_range(n))
        picks = _set()
        while _len(picks) < checked:
            picks.add(_int(self.rng_random() * n))
        return _sorted(picks)

    def foreign_mark(self, outside):
        """Threads the candidate started in its first calls (any OS thread not there before
        trial 0) may work inside its calls only. Called as a candidate call of the timing rounds
        starts (outside=True: the span since the last mark was outside the candidate's calls,
        where the harness and the reference ran) and as its forward returns (outside=False, only
        the known threads' clocks: nothing is added to the call's time where there are none).
        A thread that gained CPU time outside the calls, or began or ended there, marks the
        round: such a thread could load the device or the cores while the reference is timed,
        or launch work after the candidate's clock stopped (runtime:threads, check_foreign)."""
        if self.candidate.thread_base is None:
            return
        prev = self.watch.foreign
        if outside or prev is None:
            tids = _tids()
            if tids is None:
                return
            now = {}
            for tid in tids - self.candidate.thread_base:
                ns = _thread_cpu_ns(tid)
                if ns is not None:
                    now[tid] = ns
        else:
            now = {}
            for tid in prev:
                ns = _thread_cpu_ns(tid)
                if ns is not None:
                    now[tid] = ns
        self.watch.foreign = now
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
            self.watch.foreign_rounds.add(_max(self.rounds.round_no - 1, 0))  # the first calls count with round 0
            self.watch.foreign_ns += ran

    def check_foreign(self, rounds):
        """runtime:threads when threads of the candidate ran outside its calls in two or more of
        the timing rounds so far (one is let pass: a thread finishing what it began in the first
        calls). `rounds`: how many rounds have begun."""
        if self.watch.foreign_rounds:
            self.laps["timing: rounds with foreign thread activity"] = _len(self.watch.foreign_rounds)
            self.laps["timing: foreign thread CPU (us)"] = self.watch.foreign_ns / 1e3
        if _len(self.watch.foreign_rounds) >= 2:
            raise _Done("rejected", ["runtime:threads"],
                        f"a thread the candidate started in its first calls ran outside its calls, while the "
                        f"harness and the reference ran, in {_len(self.watch.foreign_rounds)} of {rounds} timing rounds "
                        f"({self.watch.foreign_ns / 1e3:.0f} us of CPU time); a candidate's threads may only work "
                        "inside its own calls")

    def snapshot_inside(self, out):
        """snapshot() of _INSIDE_SAMPLE elements of each output, inside a timed sample."""
        return self.snapshot(out, _INSIDE_SAMPLE)

    def snapshot(self, out, samples=_ROUND_SAMPLE):
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
                seed = self.checks.sample_bits(64)
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
                start = _int(self.rng_random() * (n - samples + 1))
                where = slice(start, start + samples)
                snap.append(_Taken(_T_clone(ys[where]), where, size, y.dtype))
                continue
            if n > samples:
                idx = _torch_randint(0, n, (samples,), generator=self.checks.sample_gen, device=y.device)
                snap.append(_Taken(_torch_index_select(ys, 0, idx), idx, size, y.dtype))
            else:
                snap.append(_Taken(_T_clone(ys), None, size, y.dtype))
        return snap

    def check_round_outputs(self, ref_out, snap, k):
        """Every timed call's outputs are held to the correctness tolerance against the
        reference's on the same inputs (a candidate that computes less, or in lower precision,
        only when it is timed fails here: runtime:timing_outputs). `snap` is the candidate's
        snapshot (snapshot()): outputs larger than _ROUND_SAMPLE elements are compared at that
        many positions drawn after the call, so the candidate cannot know which elements are
        checked; comparing every element in float64 took longer than the timed calls themselves.

        Type, shape and dtype are checked here; the count of differing elements is computed on
        the device and kept (self.checks.round_fracs), and read once per measurement by
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
                self.check_round_output_kernels(i, x, taken, where, k)
                continue
            xs = _T_reshape(x, (-1,))
            if _type(where) is slice:
                xs = xs[where]
            elif where is not None:
                xs = _torch_index_select(xs, 0, where)
            if _T_is_floating_point(xs):
                # |y - x| <= atol + rtol * |x| in float64, NaN matching NaN (env/compare.cpp).
                atol, rtol = self.tolerance(x.dtype, i)
                ok = _torch_isclose(_T_to(taken, torch.float64), _T_to(xs, torch.float64), rtol=rtol, atol=atol,
                                    equal_nan=True)
            else:
                ok = _torch_eq(xs, taken)
            self.checks.round_fracs.append((k, i, _T_numel(ok), _torch_count_nonzero(ok)))
        if bad:
            self.round_failed(k, detail)

    def check_round_output_kernels(self, i, x, taken, seed, k):
        """check_round_outputs for one output with the harness's own kernels: the reference's
        values at the positions drawn from `seed` against the candidate's snapshot, the same
        tolerance, and the mismatches counted into a slot of self.checks.round_bad (read by
        check_round_fracs)."""
        if not _T_is_contiguous(x):
            x = _T_contiguous(x)
        atol, rtol = self.tolerance(x.dtype, i)
        if self.checks.round_used == _ROUND_SLOTS:
            self.check_round_fracs()
        slot = self.checks.round_used
        self.checks.round_used += 1
        # The snapshot's size says how many positions it drew (all of them, in order, when the
        # output had no more elements than that).
        samples = _T_numel(taken)
        _kernels().round_check(x, taken, seed, samples, atol, rtol, _T_data_ptr(self.checks.round_bad) + 8 * slot)
        self.checks.round_fracs.append((k, i, samples, slot))

    def tolerance(self, dtype, i):
        """(atol, rtol) of the correctness comparison for output `i`, of `dtype` (env/compare.cpp:
        exact for the dtypes it names no tolerance for), atol widened by the reference's own
        rounding error on that output (round_slack) as the evaluator widens it for the trials."""
        atol, rtol = self.job.tolerances.get(dtype, (0.0, 0.0))
        if i < _len(self.rounds.cur_slack) and (atol > 0 or rtol > 0):
            atol += self.rounds.cur_slack[i]
        return atol, rtol

    def round_failed(self, k, detail):
        raise _Done("rejected", ["runtime:timing_outputs"],
                    f"timing round {k}: the candidate's output differs from the reference's on the same "
                    f"inputs ({detail}); every timed call is checked like a correctness trial")

    def check_round_fracs(self):
        """The kept counts of differing elements (check_round_outputs), read in one transfer."""
        fracs = self.checks.round_fracs
        self.checks.round_fracs = []
        if not fracs:
            return
        counted = [m for _, _, _, m in fracs if _type(m) is not _int]
        matching = _T_tolist(_torch_stack(counted)) if counted else []
        kernels = _kernels()
        used = self.checks.round_used if kernels is not None and self.cuda else 0
        mismatches = _T_tolist(self.checks.round_bad[:used]) if used else []
        if used:
            kernels._zero(_T_data_ptr(self.checks.round_bad), used * 8)
            self.checks.round_used = 0
        it = iter(matching)
        for k, i, n, m in fracs:
            bad = mismatches[m] if _type(m) is _int else n - next(it)
            if bad > 0:
                self.round_failed(k, f"{bad} of {n} checked elements of output {i} beyond the correctness tolerance")

    def prime_reference(self, inputs):
        """An untimed call of the reference right before its timed sample (see timing()),
        waited for like the candidate's (whose side-stream work would otherwise be counted in
        its sample). When nothing waited for it, the host queued the reference's timed calls
        while the device still ran the priming call, so a reference of many small kernels was
        timed without the host's launch gaps that the candidate's sample paid: identical code
        came out slower as the candidate."""
        try:
            if self.job.baseline == "cuda-graph":
                self.baseline.graph[0].replay()
            else:
                if self.baseline.mark_step is not None:
                    self.baseline.mark_step()
                out = self.baseline.fn(*inputs)
                del out
            self.sync()
        except _BaseException as e:
            raise _error_done(e, "in the reference during timing") from None

    def placed(self, inputs, jitter_bytes=None):
        """A copy of `inputs` whose contiguous tensors each start 0 to `jitter_bytes`
        (self.job.jitter_bytes by default; in 512-byte steps) into a fresh allocation of their size
        plus that lead; other tensors are cloned. The caching allocator hands back blocks of the
        sizes a round frees, so new allocations alone land at the same few addresses round after
        round (4 over 33 rounds on an H100); the random lead moves every round's inputs."""
        jitter = self.job.jitter_bytes if jitter_bytes is None else jitter_bytes
        if jitter < 512:
            return _clone_inputs(inputs)
        steps = jitter // 512

        def place(t):
            if _type(t) is not _Tensor or t.requires_grad or not _T_is_contiguous(t):
                return _T_clone(t)
            lead = _int(self.rng_random() * (steps + 1)) * 512
            size = _int(_T_numel(t)) * t.element_size()
            buf = _torch_empty(lead + size, dtype=_uint8, device=t.device)
            y = _torch_empty(0, dtype=t.dtype, device=t.device)
            _T_set_(y, _T_untyped_storage(buf), lead // t.element_size(), _T_size(t), _T_stride(t))
            _T_copy_(y, t)
            return y

        return [_map_tensors(x, place) for x in inputs]

    def prime_candidate(self, inputs, where):
        out, _ = self.call_candidate(inputs, where + ", untimed priming call")
        del out

    def one_round(self):
        """One paired round: each model timed once, in random order, on a sample of self.rounds.calls
        calls, each call on its own fresh inputs; returns ((synced, stream) ms per call of the
        reference, the same of the candidate, candidate first)."""
        k = self.rounds.round_no
        self.rounds.round_no += 1
        t_round = _perf_counter_ns()
        n = self.rounds.calls
        # Fresh values at fresh addresses: the previous round's inputs are still alive while
        # these are generated, outside the timed region; each model gets its own copy.
        # Seeded from the operating system, drawn now: no state of this process predicts them.
        # Every call of a sample has its own: no call can reuse another's work.
        dist = self.reference.dists[k % _len(self.reference.dists)]
        fresh = [make_inputs(self.reference.task, self.device, _fresh_seed(), dist) for _ in _range(n)]
        # The slack of this distribution's trials; the largest of all where no trial drew it.
        slack = self.reference.round_slack
        self.rounds.cur_slack = slack.get(dist) or [_max(v) for v in zip(*slack.values())]
        if self.job.jitter_bytes >= 512:  # both copies at random places (docs/evaluator.md, Timing: placement)
            # A sample's calls share the jitter: n leads of up to jitter / n bytes each.
            jitter = self.job.jitter_bytes // n
            ref_in = [self.placed(x, jitter) for x in fresh]
            cand_in = [self.placed(x, jitter) for x in fresh]
        else:
            ref_in = fresh
            cand_in = [_clone_inputs(x) for x in fresh]
        for x in cand_in[0]:
            if _isinstance(x, _Tensor):
                self.rounds.placements.add(_T_data_ptr(x))
                break
        prev_ref, prev_cand = self.rounds.prime_inputs
        # Order in balanced pairs: a random order, then the other one. Some pairs showed a
        # steady order effect (on an H100, layernorm's per-round ratio alternated 5.4x/5.6x by
        # order); with independent coin flips a bucket of rounds holds an uneven mix and its mean
        # moves with it, while a bucket of whole pairs holds both orders equally.
        if self.rounds.pair_first is None:
            cand_goes_first = self.rng_random() < 0.5
            self.rounds.pair_first = cand_goes_first
        else:
            cand_goes_first = not self.rounds.pair_first
            self.rounds.pair_first = None
        where = f"timing round {k}"
        # Every call but the last is snapshotted inside both samples (timed_candidate).
        inside = n > 1
        t0 = self.lap("round: inputs", t_round)
        # Each timed sample directly follows an untimed call of the same model on the previous
        # round's inputs. Without it, whichever call came first in a round ran 8-15% slower
        # (host-side state after generating the inputs; measured on an H100), which random
        # order turned into +-10% of noise on the speedup.
        if cand_goes_first:
            self.prime_candidate(prev_cand, where)
            t0 = self.lap("round: candidate priming", t0)
            c_ms, c_out, c_bytes = self.timed_candidate(cand_in, 2 * k, where, _ROUND_CHECKS, inside)
            t0 = self.lap("round: candidate timed", t0)
            self.prime_reference(prev_ref)
            t0 = self.lap("round: reference priming", t0)
            r_ms, r_outs = self.timed_reference(ref_in, 2 * k + 1, inside)
            t0 = self.lap("round: reference timed", t0)
        else:
            self.prime_reference(prev_ref)
            t0 = self.lap("round: reference priming", t0)
            r_ms, r_outs = self.timed_reference(ref_in, 2 * k, inside)
            t0 = self.lap("round: reference timed", t0)
            self.prime_candidate(prev_cand, where)
            t0 = self.lap("round: candidate priming", t0)
            c_ms, c_out, c_bytes = self.timed_candidate(cand_in, 2 * k + 1, where, _ROUND_CHECKS, inside)
            t0 = self.lap("round: candidate timed", t0)
        # The floor counts the outputs of checked calls only (the other calls' outputs are not).
        self.rounds.floor_bytes = c_bytes if self.rounds.floor_bytes is None else _min(self.rounds.floor_bytes, c_bytes)
        snaps, storages = c_out
        try:
            for i, snap, in_sample in snaps:
                ref = _output_items(r_outs[i]) if in_sample else _checked_reference(r_outs, storages, i)
                self.check_round_outputs(ref, snap, k)
        except _Done:
            raise
        except _BaseException as e:
            raise _error_done(e, f"comparing the outputs of {where}") from None
        t0 = self.lap("round: output check", t0)
        del r_outs, c_out, snaps
        # Kept alive until the next round's inputs exist (fresh addresses), and used for the
        # next round's priming calls.
        self.rounds.prime_inputs = (ref_in[-1], cand_in[-1])
        del fresh, ref_in, cand_in, prev_ref, prev_cand
        self.lap("round: previous inputs freed", t0)
        return r_ms, c_ms, cand_goes_first

    def choose_calls(self, ref_ms, cand_ms, in_bytes, out_bytes, inputs_ms, host_ms=0.0):
        """Calls per timed sample: as many as make the faster model's sample last
        self.job.sample_ms, at most self.job.max_calls; fewer where a round's inputs and outputs for
        both models would take more than a quarter of the device's free memory (1 GiB on the
        CPU) or drawing the inputs more than _INPUTS_MS_PER_ROUND of host time; one with sample_ms
        0 and with the graph baselines: cuda-graph copies its static inputs before each replay,
        and compile-reduce-overhead's graphs overwrite their outputs at the next step, where a
        sample keeps every call's outputs. `ref_ms`, `cand_ms`: the first calls' stream times."""
        if self.job.sample_ms <= 0 or self.job.baseline in ("cuda-graph", "compile-reduce-overhead"):
            return 1
        fastest = _max(_min(_sorted(ref_ms)[_len(ref_ms) // 2], _sorted(cand_ms)[_len(cand_ms) // 2]), 1e-6)
        calls = _min(self.job.max_calls, _max(1, _int(-(-self.job.sample_ms // fastest))))
        per_call = 2 * (in_bytes + out_bytes) + 1
        budget = 1 << 30
        if self.cuda:
            try:
                budget = torch.cuda.mem_get_info()[0] // 4
            except _BaseException:
                pass
        calls = _min(calls, _max(1, budget // per_call))
        if inputs_ms > 0:
            calls = _min(calls, _max(1, _int(_INPUTS_MS_PER_ROUND // inputs_ms)))
        if self.cuda and host_ms > 0:  # the host queues a sample well within the gate's wait
            calls = _min(calls, _max(1, _int(_GATE_HOST_MS // host_ms)))
        return calls

    def clock_warmup(self, cap_ms):
        """CUDA: keeps the device busy with spin kernels until its SM clock stops rising (for at
        most cap_ms), and logs the clock reached. A spin of C cycles takes C / f, so each batch's
        elapsed time gives the clock f. The paired rounds keep the device busy only part of the
        time, so they alone may leave a clock low after idle seconds. (It did not remove the
        1.5-2.5% slower first verdicts of a 0.26 ms kernel on an H100, which it was tried for: the
        clock was already at 1938 of 1980 MHz there.) Settled: a batch no more than 0.5% faster
        than the fastest before it, after at least _CLOCK_MIN_MS of spinning."""
        if not self.cuda or not self.rounds.can_spin:
            return
        t0 = _perf_counter_ns()
        best = 0.0
        spun = 0.0
        batches = 0
        while True:
            _Ev_record(self.ev0, self.stream0)
            for _ in _range(_CLOCK_BATCH):
                self.spin(_LAUNCH_COVER_CYCLES)
            _Ev_record(self.ev1, self.stream0)
            _Ev_synchronize(self.ev1)
            ms = _Ev_elapsed(self.ev0, self.ev1)
            spun += ms
            batches += 1
            mhz = _CLOCK_BATCH * _LAUNCH_COVER_CYCLES / (ms * 1e3) if ms > 0 else 0.0
            if spun >= _CLOCK_MIN_MS and mhz <= best * 1.005:
                break
            best = _max(best, mhz)
            if (_perf_counter_ns() - t0) >= cap_ms * 1e6:
                break
        self.laps["timing: clock warm-up batches"] = self.laps.get("timing: clock warm-up batches", 0) + batches
        self.laps["timing: SM clock after warm-up (MHz)"] = mhz

    def await_measure(self):
        """Says the warm-up is over and waits for the evaluator's word to begin the measured
        rounds (it lets starting workers' context creations finish first; docs/evaluator.md,
        Timing). On CUDA the device spins meanwhile, so that its clocks stay up."""
        t0 = _perf_counter_ns()
        self.chan.send({"type": "warmed"})
        if self.cuda and self.rounds.can_spin:
            msg = None
            while msg is None:
                for _ in _range(5):
                    self.spin(_LAUNCH_COVER_CYCLES)
                _cuda_synchronize()
                msg = self.chan.poll()
        else:
            msg = self.chan.recv()
        if msg.get("type") == "stop":
            _os_exit(0)
        if msg.get("type") != "measure":
            raise _Done("runtime_error", (), f"expected measure, got {msg.get('type')!r}")
        self.lap("timing: waiting to measure", t0)

    def reserve_for_rounds(self, inputs):
        """CUDA: one allocation for the timing rounds' buffers, handed back to torch's caching
        allocator at once. Each round copies its inputs into blocks of their size plus a random
        lead; blocks the trials left behind are too small for those, so without it each new size
        asked the driver for memory, in the first rounds above all and sometimes inside a timed
        call. Blocks cut from one large free block need no driver call."""
        t0 = _perf_counter_ns()
        nbytes = _sum(_int(_T_numel(t)) * t.element_size() for t in _tensors_in(inputs))
        want = 8 * nbytes + 4 * self.job.jitter_bytes
        try:
            free, _total = torch.cuda.mem_get_info()
            want = _min(want, free // 2)
            if want >= (64 << 20):
                block = _torch_empty(want, dtype=_uint8, device="cuda")
                del block
        except _BaseException:
            pass  # an optimisation only: the rounds then allocate as they go
        self.laps["timing: reserved MiB"] = want / (1 << 20)
        self.lap("timing: reserve", t0)

    def measure_floor(self):
        """The physics floor of a timed call (KernelGuard's): half the fastest of five fills of
        as many bytes as the candidate's outputs held (_output_bytes; the fewest of its calls in
        the rounds so far, whose outputs are all checked), timed as a timed call is (after the
        cache flush and, on CUDA, from the start event on the timing stream to the event after
        the fill). No call can produce its outputs faster than the device writes them, nor in
        less than one launch, which the fill also takes; the half leaves room for a fill slower
        than the best possible writes. Measured once, after the first measured rounds; sent
        with every measurement, and the evaluator compares the candidate's median settled time
        with it (runtime:below_floor, env/evaluator.cpp)."""
        t0 = _perf_counter_ns()
        nbytes = _max(_int(self.rounds.floor_bytes or 0), 1)
        buf = _torch_empty(nbytes, dtype=_uint8, device=self.device)
        best = None
        n = self.rounds.calls  # fills back to back, as many as a timed sample's calls
        kernels = _kernels()

        def fill():
            if kernels is not None:
                kernels._zero(_T_data_ptr(buf), nbytes)
            else:
                _T_zero_(buf)

        for i in _range(5):
            if self.cuda:
                # The fills behind the gate, back to back, as a sample's calls are.
                _, _, gated = self.gated_calls(fill, [()] * n, False, -10 - i)
                _Ev_synchronize(self.ev_call)
                self.gate_outcome(gated)
                ms = _Ev_elapsed(self.ev0, self.ev_call) / n
            else:
                self.flush(-10 - i)
                t1 = _perf_counter_ns()
                for _ in _range(n):
                    fill()
                ms = (_perf_counter_ns() - t1) / 1e6 / n
            best = ms if best is None else _min(best, ms)
        del buf
        self.rounds.floor_ms = 0.5 * best
        self.laps["timing: floor (us)"] = self.rounds.floor_ms * 1e3
        self.laps["timing: floor bytes"] = nbytes
        self.lap("timing: floor", t0)

    def timing(self, rounds, warmup_ms, warmup_rounds=3, announce=False):
        """Warm-up and `rounds` measured rounds (timing_rounds), with the cyclic garbage
        collector off under evaluator.quiet_gc."""
        collecting = self.job.quiet_gc and _gc_isenabled()
        if collecting:
            _gc_disable()
        self.timing_now = True
        try:
            return self.timing_rounds(rounds, warmup_ms, warmup_rounds, announce)
        finally:
            self.timing_now = False
            if collecting:
                _gc_enable()

    def timing_rounds(self, rounds, warmup_ms, warmup_rounds, announce):
        t_first = _perf_counter_ns()
        self.watch.foreign = None  # the first mark starts the watch (foreign_mark)
        clocked = False  # the clock warm-up ran in this call
        if not self.rounds.warmed:
            t_in = _perf_counter_ns()
            inputs = make_inputs(self.reference.task, self.device, self.job.seed + 6_000_001, 0)
            placed = self.placed(inputs)
            inputs_ms = (_perf_counter_ns() - t_in) / 1e6  # what one call's inputs cost to draw and place
            del placed
            if self.cuda and self.job.timing_reserve:
                self.reserve_for_rounds(inputs)
            ref_first, cand_first = [], []
            out_bytes = 0
            host_first = []
            if warmup_ms > 0:  # the first calls' times choose the calls per sample: clocks up first
                self.clock_warmup(warmup_ms)
                clocked = True
            for i in _range(3):
                ms, out, nbytes = self.timed_candidate([_clone_inputs(inputs)], -1 - i, f"warm-up call {i}")
                cand_first.append(ms[1])
                host_first.append(self.rounds.host_ms)
                out_bytes = _max(out_bytes, nbytes)
                del out
                ms, out = self.timed_reference([_clone_inputs(inputs)], -1 - i)
                ref_first.append(ms[1])
                host_first.append(self.rounds.host_ms)
                del out
            in_bytes = _sum(_int(_T_numel(t)) * t.element_size() for t in _tensors_in(inputs))
            # The slower model's median host time per call (the first call of each may be slow).
            host_ms = _max(_sorted(host_first[0::2])[1], _sorted(host_first[1::2])[1])
            self.rounds.calls = self.choose_calls(ref_first, cand_first, in_bytes, out_bytes, inputs_ms, host_ms)
            self.laps["timing: first calls' host time per call (ms)"] = host_ms
            self.laps["timing: calls per sample"] = self.rounds.calls
            self.laps["timing: first calls' inputs (ms)"] = inputs_ms
            self.rounds.prime_inputs = (inputs, _clone_inputs(inputs))
            del inputs
            self.rounds.warmed = True
            self.lap("timing: first calls", t_first)
        # Warm-up rounds, untimed, until both models' times have settled, for at most warmup_ms:
        # after idle seconds a GPU's clocks are low, and on an H200 the first ~12 rounds ran up
        # to 30% slower, which decided whole verdicts. While the clocks rise, each round is
        # faster than the ones before; settled means the median of the last three rounds is
        # within _WARMUP_SETTLED of the fastest warm-up round so far, for both models.
        t0 = _perf_counter_ns()
        if warmup_ms > 0 and not clocked:  # not again right after the first calls' warm-up
            self.clock_warmup(warmup_ms)
        n = 0
        ref_seen, cand_seen = [], []
        while n < warmup_rounds or (warmup_ms > 0 and not (_settled(ref_seen) and _settled(cand_seen))
                                    and (_perf_counter_ns() - t0) < warmup_ms * 1e6):
            r_ms, c_ms, _ = self.one_round()
            n += 1
            ref_seen.append(r_ms[1])
            cand_seen.append(c_ms[1])
        self.check_round_fracs()
        self.check_foreign(self.rounds.round_no)
        self.lap("timing: warm-up rounds", t0)
        self.laps["timing: warm-up round count"] = self.laps.get("timing: warm-up round count", 0) + n
        if announce:
            self.await_measure()
            self.watch.foreign = None  # waiting for the evaluator's word is not a round
        t0 = _perf_counter_ns()
        self.rounds.pair_first = None  # measured rounds start a pair
        ref_ms, cand_ms, ref_stream_ms, cand_stream_ms, first = [], [], [], [], []
        for _ in _range(rounds):
            r_ms, c_ms, cand_goes_first = self.one_round()
            ref_ms.append(_float(r_ms[0]))
            ref_stream_ms.append(_float(r_ms[1]))
            cand_ms.append(_float(c_ms[0]))
            cand_stream_ms.append(_float(c_ms[1]))
            first.append(_bool(cand_goes_first))
        self.check_round_fracs()
        self.check_foreign(self.rounds.round_no)
        self.lap("timing: measured rounds", t0)
        if self.rounds.floor_ms is None:
            self.measure_floor()
        self.laps["timing: measured round count"] = self.laps.get("timing: measured round count", 0) + rounds
        self.laps["timing: distinct candidate input addresses"] = _len(self.rounds.placements)
        return {"ref_ms": ref_ms, "cand_ms": cand_ms, "ref_stream_ms": ref_stream_ms,
                "cand_stream_ms": cand_stream_ms, "cand_first": first, "floor_ms": self.rounds.floor_ms,
                "calls": self.rounds.calls,
                "floor_bytes": self.laps.get("timing: floor bytes", 0)}


def _settled(times):
    """The median of the last three times is within _WARMUP_SETTLED of the smallest so far."""
    if _len(times) < 3:
        return False
    last = sorted(times[-3:])[1]
    return last <= (1.0 + _WARMUP_SETTLED) * _min(times)
