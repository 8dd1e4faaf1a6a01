"""timing.py's functions that need no device and no running Worker: the calls per timed sample
(choose_calls), the tolerance of the round output checks (tolerance), the checked calls of a
sample (check_indices), the timed outputs' snapshots and their check against the reference's
(snapshot, check_round_outputs, check_round_fracs, round_failed), the warm-up's settling rule
(_settled), the thread watch (foreign_mark, check_foreign), the cache flush's buffer (CacheFlush,
flush), the floor on the CPU (measure_floor) and the state objects made before any candidate code.

Where a function takes the Worker `w`, the tests hand it a SimpleNamespace with the attributes that
function reads (the real Worker needs its own process, channel and device); elapsed() is not
tested here: it reads CUDA events only."""
import math
import random
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from conftest import load_worker

# A job message as the evaluator sends it (env/eval/worker_messages.cpp), parsed by the real
# parse_job; tests override the fields they are about.
JOB_MSG = {
    "type": "job", "seed": 7, "trials": 3, "rounding_factor": 0.0, "baseline": "eager",
    "tolerances": {"float32": [1e-4, 1e-5], "float16": [1e-2, 1e-2], "bfloat16": [0.0, 1e-2], "int32": [0.0, 0.0]},
    "flush_bytes": 1 << 12, "placement_jitter_bytes": 0, "timing_reserve": False, "sample_ms": 2.0,
    "max_calls": 1000, "quiet_gc": False, "eval_mode": True, "candidate_source": "", "task_source": "",
    "reference_only": False, "static_checks": True, "outputs": "host", "peaks": False,
}

MiB = 1 << 20


def make_job(harness, device="cpu", **fields):
    return harness["job"].parse_job({**JOB_MSG, **fields}, harness["device"].kind_of(device))


def cpu_worker(rng_random=None):
    """The Worker's attributes these functions read, on the CPU."""
    return SimpleNamespace(kind=load_worker()._OWN_MODULES["device"].CPU, device="cpu", laps={}, rng_random=rng_random or random.Random(1).random)


def scripted(values):
    """An rng_random that returns `values` in turn (and says how many it gave)."""
    it = iter(values)

    def draw():
        draw.count += 1
        return next(it)

    draw.count = 0
    return draw


def round_checks():
    # As Worker.run makes them (worker.py), with fixed seeds.
    return SimpleNamespace(round_fracs=[], round_bad=None, round_used=0,
                           sample_gen=torch.Generator().manual_seed(3), sample_bits=random.Random(3).getrandbits)


# ------------------------------------------------------------------------------------------------
# choose_calls

def choose(timing, harness, ref_ms=(1.0, 1.0, 1.0), cand_ms=(1.0, 1.0, 1.0), in_bytes=0, out_bytes=0,
           inputs_ms=0.0, host_ms=0.0, w=None, device="cpu", **job):
    return timing.choose_calls(w or cpu_worker(), make_job(harness, device, **job), list(ref_ms), list(cand_ms),
                               in_bytes, out_bytes, inputs_ms, host_ms)


def test_choose_calls_one_call_without_a_sample_time_or_with_the_graph_baselines(timing, harness):
    fast = dict(ref_ms=(0.01,) * 3, cand_ms=(0.01,) * 3)
    assert choose(timing, harness, **fast, sample_ms=2.0) == 200
    assert choose(timing, harness, **fast, sample_ms=0.0) == 1
    assert choose(timing, harness, **fast, sample_ms=-5.0) == 1  # parse_job clamps it to 0
    assert choose(timing, harness, **fast, baseline="compile-reduce-overhead") == 1
    assert choose(timing, harness, **fast, baseline="cuda-graph", device="cuda") == 1
    assert choose(timing, harness, **fast, baseline="compile") == 200


def test_choose_calls_fills_the_sample_time_of_the_faster_models_median(timing, harness):
    # Medians 0.5 (reference) and 0.25 (candidate): the faster fills 2 ms in 8 calls.
    assert choose(timing, harness, ref_ms=(0.5, 0.3, 0.9), cand_ms=(0.2, 0.25, 5.0)) == 8
    # A slow first call (or a fast outlier) does not move the median.
    assert choose(timing, harness, ref_ms=(50.0, 0.25, 0.25), cand_ms=(0.25, 0.01, 1.0)) == 8
    assert choose(timing, harness, ref_ms=(0.5, 0.01, 0.5), cand_ms=(1.0,) * 3) == 4
    # Rounded up: 2 ms of 0.3 ms calls is 6.7 calls, so 7.
    assert choose(timing, harness, ref_ms=(0.3,) * 3, cand_ms=(1.0,) * 3) == 7
    # A call longer than the sample time: one call.
    assert choose(timing, harness, ref_ms=(5.0,) * 3, cand_ms=(9.0,) * 3) == 1


def test_choose_calls_tiny_and_zero_times_are_capped_by_max_calls(timing, harness):
    tiny = dict(ref_ms=(2.0 ** -10,) * 3, cand_ms=(1.0,) * 3)  # 2 ms / 2**-10 ms = 2048 calls
    assert choose(timing, harness, **tiny, max_calls=1000) == 1000
    assert choose(timing, harness, **tiny, max_calls=10_000) == 2048
    zero = dict(ref_ms=(0.0,) * 3, cand_ms=(0.0,) * 3)
    assert choose(timing, harness, **zero, max_calls=1000) == 1000
    # Zero times count as 1e-6 ms: a finite count, not a division by zero.
    assert choose(timing, harness, **zero, max_calls=10 ** 9) == 2_000_001
    assert choose(timing, harness, **zero, max_calls=0) == 1  # parse_job: at least one call


def test_choose_calls_keeps_a_rounds_inputs_and_outputs_within_a_gib_on_the_cpu(timing, harness):
    many = dict(ref_ms=(0.001,) * 3, cand_ms=(0.001,) * 3, max_calls=100_000)  # 2000 calls by time
    assert choose(timing, harness, **many) == 2000
    # Both models' inputs and outputs: 2 * 100 MiB a call; 5 calls (1000 MiB) fit, 6 do not.
    assert choose(timing, harness, **many, in_bytes=60 * MiB, out_bytes=40 * MiB) == 5
    assert choose(timing, harness, **many, in_bytes=MiB, out_bytes=MiB // 2) == 341  # 1023 MiB; 342: 1026
    # Inputs larger than the budget: still one call.
    assert choose(timing, harness, **many, in_bytes=4 << 30, out_bytes=1 << 30) == 1


def test_choose_calls_allows_a_round_of_exactly_the_budget(timing, harness):
    # 4 calls of 2 * 128 MiB are exactly 1 GiB: not more than it.
    assert choose(timing, harness, ref_ms=(0.001,) * 3, cand_ms=(0.001,) * 3, in_bytes=128 * MiB) == 4


def test_choose_calls_keeps_drawing_the_inputs_within_100_ms_a_round(timing, harness):
    slow = dict(ref_ms=(1.0,) * 3, cand_ms=(1.0,) * 3, sample_ms=1000.0, max_calls=10_000)  # 1000 by time
    assert timing._INPUTS_MS_PER_ROUND == 100.0
    assert choose(timing, harness, **slow, inputs_ms=0.0) == 1000  # not measured: no limit
    assert choose(timing, harness, **slow, inputs_ms=1.0) == 100
    assert choose(timing, harness, **slow, inputs_ms=25.0) == 4  # exactly 100 ms: allowed
    assert choose(timing, harness, **slow, inputs_ms=30.0) == 3
    assert choose(timing, harness, **slow, inputs_ms=200.0) == 1


def test_choose_calls_host_time_counts_on_cuda_only(timing, harness, monkeypatch):
    # The CUDA branch asks the device for its free memory; these CPU-only tests have no device,
    # so torch.cuda.mem_get_info answers 8 GiB free of 16 here (the budget: a quarter, 2 GiB).
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (8 << 30, 16 << 30))
    cuda = SimpleNamespace(kind=harness["device"].CUDA)
    many = dict(ref_ms=(0.001,) * 3, cand_ms=(0.001,) * 3)  # 2000 calls by time, max_calls 1000
    assert choose(timing, harness, **many, host_ms=0.5) == 1000  # the CPU's timing has no gate
    assert choose(timing, harness, **many, host_ms=0.5, w=cuda) == 20  # 10 ms of host time
    assert choose(timing, harness, **many, host_ms=0.3, w=cuda) == 33
    assert choose(timing, harness, **many, host_ms=20.0, w=cuda) == 1
    assert choose(timing, harness, **many, host_ms=0.0, w=cuda) == 1000
    assert choose(timing, harness, **many, in_bytes=100 * MiB, w=cuda) == 10  # 2 GiB / 200 MiB


def test_choose_calls_on_cuda_falls_back_to_a_gib_when_the_device_cannot_say(timing, harness, monkeypatch):
    def no_device(*a):
        raise RuntimeError("Found no NVIDIA driver on your system")

    monkeypatch.setattr(torch.cuda, "mem_get_info", no_device)
    many = dict(ref_ms=(0.001,) * 3, cand_ms=(0.001,) * 3, w=SimpleNamespace(kind=harness["device"].CUDA))
    assert choose(timing, harness, **many, in_bytes=100 * MiB) == 5


def test_the_gates_host_time_is_a_tenth_of_its_wait(timing):
    # _GATE_CYCLES at 2 GHz is _GATE_MS, and choose_calls keeps a sample's host time to a tenth.
    assert timing._GATE_CYCLES / 2e9 * 1e3 == timing._GATE_MS
    assert timing._GATE_HOST_MS == timing._GATE_MS / 10


# ------------------------------------------------------------------------------------------------
# tolerance

def test_tolerance_per_dtype_widened_by_each_outputs_slack(timing, harness):
    job = make_job(harness)
    state = timing.TimingState(False)
    state.cur_slack = [0.5, 0.25]
    assert timing.tolerance(job, state, torch.float32, 0) == (1e-4 + 0.5, 1e-5)
    assert timing.tolerance(job, state, torch.float32, 1) == (1e-4 + 0.25, 1e-5)
    assert timing.tolerance(job, state, torch.float32, 2) == (1e-4, 1e-5)  # no slack for output 2
    assert timing.tolerance(job, state, torch.float16, 0) == (1e-2 + 0.5, 1e-2)
    # An rtol alone is a tolerance too: the slack widens atol from 0.
    assert timing.tolerance(job, state, torch.bfloat16, 1) == (0.25, 1e-2)


def test_tolerance_exact_dtypes_stay_exact(timing, harness):
    job = make_job(harness)
    state = timing.TimingState(False)
    state.cur_slack = [0.5]
    assert timing.tolerance(job, state, torch.int32, 0) == (0.0, 0.0)  # named with (0, 0)
    assert timing.tolerance(job, state, torch.int64, 0) == (0.0, 0.0)  # not named
    assert timing.tolerance(job, state, torch.float64, 0) == (0.0, 0.0)
    state.cur_slack = []
    assert timing.tolerance(job, state, torch.float32, 0) == (1e-4, 1e-5)


# ------------------------------------------------------------------------------------------------
# check_indices

def test_check_indices_all_calls_when_there_are_no_more_than_checked(timing):
    def never():
        raise AssertionError("drew from the generator")

    w = cpu_worker(never)
    assert timing.check_indices(w, 0, 4) == []
    assert timing.check_indices(w, 1, 4) == [0]
    assert timing.check_indices(w, 3, 4) == [0, 1, 2]
    assert timing.check_indices(w, 4, 4) == [0, 1, 2, 3]


def test_check_indices_draws_distinct_calls_from_the_harness_generator(timing):
    draw = scripted([0.0, 0.05, 0.99, 0.05, 0.5, 0.7])
    # 0, 0 (again), 9, 0 (again), 5: three distinct after five draws, sorted.
    assert timing.check_indices(cpu_worker(draw), 10, 3) == [0, 5, 9]
    assert draw.count == 5
    rng = random.Random(11).random
    for n in (5, 6, 40):
        for _ in range(20):
            picks = timing.check_indices(cpu_worker(rng), n, 4)
            assert len(picks) == 4 and len(set(picks)) == 4 and picks == sorted(picks)
            assert 0 <= picks[0] and picks[-1] < n


# ------------------------------------------------------------------------------------------------
# snapshot, check_round_outputs, check_round_fracs, round_failed

def test_round_failed_rejects_with_timing_outputs(timing, channel):
    with pytest.raises(channel._Done) as e:
        timing.round_failed(7, "an output of another type")
    assert e.value.status == "rejected"
    assert e.value.checks == ["runtime:timing_outputs"]
    assert e.value.message == ("timing round 7: the candidate's output differs from the reference's on the same "
                               "inputs (an output of another type); every timed call is checked like a correctness "
                               "trial")


def test_snapshot_of_small_outputs_is_a_copy_of_every_element(timing, outputs):
    w, checks = cpu_worker(), round_checks()
    y = torch.arange(10, dtype=torch.float32).reshape(2, 5)
    e = torch.empty(0, 3, dtype=torch.int64)
    snap = timing.snapshot(w, checks, (y, e, 3))
    assert [type(s) for s in snap] == [outputs._Taken, outputs._Taken, int]
    assert snap[0].where is None and snap[0].size == (2, 5) and snap[0].dtype == torch.float32
    y.fill_(-1)  # written after the clock stopped: not in the snapshot
    assert snap[0].values.tolist() == [float(v) for v in range(10)]
    assert (snap[1].values, snap[1].where, snap[1].size, snap[1].dtype) == (None, None, (0, 3), torch.int64)
    assert snap[2] == 3


def test_snapshot_of_large_outputs_draws_round_sample_positions(timing):
    w, checks = cpu_worker(), round_checks()
    n = timing._ROUND_SAMPLE + 1000
    y = torch.arange(n, dtype=torch.float64)
    (t,) = timing.snapshot(w, checks, y)
    assert t.where.shape == (timing._ROUND_SAMPLE,) and t.size == (n,)
    assert int(t.where.min()) >= 0 and int(t.where.max()) < n
    assert torch.equal(t.values, t.where.to(torch.float64))  # y[i] == i


def test_snapshot_inside_a_sample_takes_one_window(timing):
    s = timing._INSIDE_SAMPLE
    w, checks = cpu_worker(scripted([0.5])), round_checks()
    y = torch.arange(s + 10, dtype=torch.int32)
    (t,) = timing.snapshot_inside(w, checks)(y)
    assert t.where == slice(5, 5 + s)  # int(0.5 * 11)
    y.zero_()
    assert t.values.tolist() == list(range(5, 5 + s))
    # No larger than the window: all of it, as after the clock stops.
    (t,) = timing.snapshot_inside(cpu_worker(scripted([])), checks)(torch.ones(s))
    assert t.where is None and t.values.numel() == s


def check(timing, job, state, checks, ref, cand, k=0, snap=None):
    """The round output check of a candidate output against the reference's, then the read of
    the counts (what timing_rounds does once per measurement)."""
    snap = snap if snap is not None else timing.snapshot(cpu_worker(), checks, cand)
    timing.check_round_outputs(cpu_worker(), job, state, checks, ref, snap, k)
    timing.check_round_fracs(cpu_worker(), checks)


def test_check_round_outputs_passes_within_the_tolerance(timing, harness):
    job, state, checks = make_job(harness), timing.TimingState(False), round_checks()
    x = torch.linspace(-1, 1, 10)
    check(timing, job, state, checks, x, x.clone())
    check(timing, job, state, checks, x, x + 0.5e-4)  # |y - x| <= 1e-4 + 1e-5 * |x|
    nan = x.clone()
    nan[3] = float("nan")
    check(timing, job, state, checks, nan, nan.clone())  # NaN matches NaN
    ints = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    check(timing, job, state, checks, (x, ints), (x.clone(), ints.clone()))
    state.cur_slack = [1e-2]  # the reference's own rounding error widens atol
    check(timing, job, state, checks, x, x + 5e-3)
    assert checks.round_fracs == []


def test_check_round_outputs_counts_the_elements_beyond_the_tolerance(timing, harness, channel):
    job, state, checks = make_job(harness), timing.TimingState(False), round_checks()
    x = torch.linspace(-1, 1, 10)
    y = x.clone()
    y[2] += 1e-3
    y[7] = float("nan")
    with pytest.raises(channel._Done) as e:
        check(timing, job, state, checks, x, y, k=4)
    assert e.value.checks == ["runtime:timing_outputs"]
    assert "timing round 4:" in e.value.message
    assert "(2 of 10 checked elements of output 0 beyond the correctness tolerance)" in e.value.message
    assert checks.round_fracs == []  # read and cleared, failing or not
    # Integers are compared exactly: the second output is 1 off in one place.
    ints = torch.arange(6, dtype=torch.int64)
    bad = ints.clone()
    bad[5] = 6
    with pytest.raises(channel._Done) as e:
        check(timing, job, state, checks, (x, ints), (x.clone(), bad), k=1)
    assert "(1 of 6 checked elements of output 1 beyond" in e.value.message


def test_check_round_outputs_of_sampled_outputs(timing, harness, channel):
    job, state, checks = make_job(harness), timing.TimingState(False), round_checks()
    x = torch.zeros(timing._ROUND_SAMPLE + 5)
    check(timing, job, state, checks, x, x.clone())
    with pytest.raises(channel._Done) as e:
        check(timing, job, state, checks, x, x + 1)
    assert f"({timing._ROUND_SAMPLE} of {timing._ROUND_SAMPLE} checked elements of output 0" in e.value.message


def test_check_round_outputs_of_a_window_sees_only_the_window(timing, harness, channel):
    s = timing._INSIDE_SAMPLE
    job, state, checks = make_job(harness), timing.TimingState(False), round_checks()
    x = torch.zeros(s + 10)
    y = x.clone()
    y[:5] = 1.0  # outside the window [5, 5 + s)
    snap = timing.snapshot_inside(cpu_worker(scripted([0.5])), checks)(y)
    check(timing, job, state, checks, x, None, snap=snap)
    y[5] = 1.0
    snap = timing.snapshot_inside(cpu_worker(scripted([0.5])), checks)(y)
    with pytest.raises(channel._Done) as e:
        check(timing, job, state, checks, x, None, snap=snap)
    assert f"(1 of {s} checked elements of output 0" in e.value.message


@pytest.mark.parametrize("cand, detail", [
    ((torch.zeros(4), torch.zeros(4)), "a different number of outputs"),
    (torch.zeros(2, 2), "an output of another shape or dtype"),
    (torch.zeros(4, dtype=torch.float64), "an output of another shape or dtype"),
    (0.0, "an output of another type"),
])
def test_check_round_outputs_fails_at_once_on_kind_shape_and_dtype(timing, harness, channel, cand, detail):
    job, state, checks = make_job(harness), timing.TimingState(False), round_checks()
    snap = timing.snapshot(cpu_worker(), checks, cand)
    with pytest.raises(channel._Done) as e:
        timing.check_round_outputs(cpu_worker(), job, state, checks, torch.zeros(4), snap, 2)
    assert e.value.message.startswith(f"timing round 2: the candidate's output differs from the reference's on the "
                                      f"same inputs ({detail})")


def test_check_round_fracs_reads_the_kept_counts_once(timing, channel):
    w, checks = cpu_worker(), round_checks()
    assert timing.check_round_fracs(w, checks) is None  # nothing kept
    checks.round_fracs = [(0, 0, 5, torch.tensor(5)), (0, 1, 3, torch.tensor(3))]
    timing.check_round_fracs(w, checks)
    assert checks.round_fracs == []
    checks.round_fracs = [(0, 0, 5, torch.tensor(5)), (1, 1, 4, torch.tensor(2)), (2, 0, 3, torch.tensor(0))]
    with pytest.raises(channel._Done) as e:
        timing.check_round_fracs(w, checks)
    # The first check with mismatches is the one reported.
    assert e.value.message.startswith("timing round 1: ")
    assert "(2 of 4 checked elements of output 1 beyond the correctness tolerance)" in e.value.message
    assert checks.round_fracs == []


# ------------------------------------------------------------------------------------------------
# _settled

def test_settled_needs_three_times(timing):
    assert not timing._settled([])
    assert not timing._settled([1.0, 1.0])
    assert timing._settled([1.0, 1.0, 1.0])


def test_settled_median_of_the_last_three_within_3_percent_of_the_fastest(timing):
    assert timing._WARMUP_SETTLED == 0.03
    limit = (1.0 + timing._WARMUP_SETTLED) * 1.0
    assert timing._settled([1.0, limit, limit, limit])  # the boundary counts as settled
    assert not timing._settled([1.0, limit, math.nextafter(limit, 2.0), math.nextafter(limit, 2.0)])
    assert timing._settled([1.0, 5.0, 1.01, 1.02])  # one slow round of the last three
    assert not timing._settled([1.0, 5.0, 1.02, 5.0])  # two
    assert not timing._settled([2.0, 1.5, 1.2, 1.0])  # still getting faster
    assert not timing._settled([0.5, 1.0, 1.0, 1.0])  # the fastest of all rounds, not of the last three
    assert timing._settled([3.0, 2.0, 1.0, 1.0, 1.0])


# ------------------------------------------------------------------------------------------------
# The thread watch

def test_check_foreign_lets_one_round_pass(timing, channel):
    w, watch = cpu_worker(), timing.ThreadWatch()
    timing.check_foreign(w, watch, 5)
    assert w.laps == {}
    watch.foreign_rounds, watch.foreign_ns = {0}, 2_000
    timing.check_foreign(w, watch, 5)
    assert w.laps == {"timing: rounds with foreign thread activity": 1, "timing: foreign thread CPU (us)": 2.0}
    watch.foreign_rounds, watch.foreign_ns = {0, 3}, 1_500_000
    with pytest.raises(channel._Done) as e:
        timing.check_foreign(w, watch, 5)
    assert e.value.status == "rejected" and e.value.checks == ["runtime:threads"]
    assert "in 2 of 5 timing rounds (1500 us of CPU time)" in e.value.message


def test_foreign_mark_does_nothing_before_the_trials_counted_threads(timing):
    watch = timing.ThreadWatch()
    timing.foreign_mark(SimpleNamespace(thread_base=None), timing.TimingState(False), watch, True)
    assert watch.foreign is None and watch.foreign_rounds == set()


def test_foreign_mark_marks_rounds_where_a_candidate_thread_ran_outside_its_calls(timing, outputs):
    # A real thread started after the trials' count (Candidate.thread_base), idle or burning CPU
    # between the marks as the test says.
    cand = SimpleNamespace(thread_base=outputs._tids())
    state, watch = timing.TimingState(False), timing.ThreadWatch()
    go, done, stop = threading.Event(), threading.Event(), threading.Event()
    tid = []

    def helper():
        tid.append(threading.get_native_id())
        while True:
            go.wait()
            go.clear()
            if stop.is_set():
                return
            t0 = time.thread_time_ns()
            while time.thread_time_ns() - t0 < 2_000_000:
                pass
            done.set()

    def blocked():
        # Until the helper's CPU clock stops: it waits on `go` again.
        before = outputs._thread_cpu_ns(tid[0])
        for _ in range(200):
            time.sleep(0.001)
            now = outputs._thread_cpu_ns(tid[0])
            if now == before:
                return
            before = now
        raise AssertionError("the helper thread did not block")

    def burn():
        done.clear()
        go.set()
        assert done.wait(5)
        blocked()

    t = threading.Thread(target=helper, daemon=True)
    t.start()
    try:
        while not tid:
            time.sleep(0.001)
        blocked()
        state.round_no = 1
        timing.foreign_mark(cand, state, watch, True)  # the first mark starts the watch
        assert set(watch.foreign) == {tid[0]} and watch.foreign_rounds == set()
        timing.foreign_mark(cand, state, watch, False)
        state.round_no = 2
        timing.foreign_mark(cand, state, watch, True)  # idle in between: nothing
        assert watch.foreign_rounds == set() and watch.foreign_ns == 0
        burn()
        state.round_no = 3
        timing.foreign_mark(cand, state, watch, True)  # ran outside the calls: round 2 marked
        assert watch.foreign_rounds == {2} and watch.foreign_ns >= 2_000_000
        ran = watch.foreign_ns
        state.round_no = 4
        timing.foreign_mark(cand, state, watch, True)
        burn()  # inside the candidate's call
        timing.foreign_mark(cand, state, watch, False)
        timing.foreign_mark(cand, state, watch, True)
        assert watch.foreign_rounds == {2} and watch.foreign_ns == ran
    finally:
        stop.set()
        go.set()
        t.join(5)
    for _ in range(1000):  # the OS thread outlives join() briefly
        if tid[0] not in outputs._tids():
            break
        time.sleep(0.001)
    state.round_no = 5
    timing.foreign_mark(cand, state, watch, True)  # it ended outside the calls: round 4 marked
    assert watch.foreign_rounds == {2, 4} and watch.foreign == {}


# ------------------------------------------------------------------------------------------------
# The state made before any candidate code, the cache flush and the floor

@pytest.mark.parametrize("make", [
    lambda t: t.TimingState(True), lambda t: t.RoundChecks(None, None), lambda t: t.ThreadWatch(),
    lambda t: t.CacheFlush(16, "cpu"),
])
def test_the_timing_state_takes_no_new_attributes(timing, make):
    obj = make(timing)
    assert not hasattr(obj, "__dict__")
    with pytest.raises(AttributeError):
        obj.extra = 1


def test_the_timing_state_starts_empty(timing):
    state = timing.TimingState(True)
    assert (state.warmed, state.prime_inputs, state.round_no, state.pair_first, state.calls, state.host_ms,
            state.cur_slack, state.placements, state.floor_bytes, state.floor_ms, state.can_spin) == (
        False, None, 0, None, 1, 0.0, [], set(), None, None, True)
    gen = torch.Generator()
    checks = timing.RoundChecks(gen, random.Random(0).getrandbits)
    assert (checks.round_fracs, checks.round_bad, checks.round_used, checks.sample_gen) == ([], None, 0, gen)
    watch = timing.ThreadWatch()
    assert (watch.foreign, watch.foreign_rounds, watch.foreign_ns) == (None, set(), 0)


@pytest.mark.parametrize("nbytes, elements", [(1 << 12, 1024), (1001, 250), (4, 1), (3, 1), (0, 1)])
def test_cache_flush_reads_its_bytes_on_the_cpu(timing, nbytes, elements):
    cache = timing.CacheFlush(nbytes, "cpu")
    assert cache.buf.dtype == torch.int32 and cache.buf.shape == (elements,) and cache.buf.device.type == "cpu"
    assert bool((cache.buf == 1).all())
    assert cache.total.dtype == torch.int64 and cache.total.shape == ()
    timing.flush(cpu_worker(), timing.TimingState(False), cache, 0)
    assert int(cache.total) == elements  # every element read


def test_measure_floor_on_the_cpu(timing):
    laps = []
    w = cpu_worker()
    w.lap = lambda name, t0: laps.append(name) or time.perf_counter_ns()
    state, cache = timing.TimingState(False), timing.CacheFlush(1 << 12, "cpu")
    state.floor_bytes = 4096
    timing.measure_floor(w, state, cache)
    assert w.laps["timing: floor bytes"] == 4096
    assert 0 < state.floor_ms < 100
    assert w.laps["timing: floor (us)"] == state.floor_ms * 1e3
    assert laps == ["timing: floor"]
    state.floor_bytes, state.floor_ms = None, None  # no checked call's bytes yet: one byte
    timing.measure_floor(w, state, cache)
    assert w.laps["timing: floor bytes"] == 1 and state.floor_ms > 0
