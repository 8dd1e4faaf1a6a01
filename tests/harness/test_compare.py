"""The comparisons and tolerances inside the worker: outputs.py's _output_sample/_same_sample (the
reference's determinism check), timing.py's per-output tolerance and the timed outputs' check
(check_round_outputs, check_round_fracs: |cand - ref| <= atol + rtol |ref|, NaN matching NaN,
as env/eval/compare.cpp), and _settled (when warm-up rounds have settled)."""
import math
import random
import types

import pytest
import torch

F32 = (1e-4, 1e-4)


# ------------------------------------------------------------------------------------------------
# _output_sample and _same_sample.

def test_output_sample_positions(outputs):
    small = torch.arange(10, dtype=torch.float32)
    big = torch.arange(10_000, dtype=torch.int32).reshape(100, 100)
    s_small, s_big, s_none, s_empty = outputs._output_sample((small, big, None, torch.empty(0)))
    assert s_small.dtype == torch.float64 and torch.equal(s_small, small.double())
    # 4096 positions i * (n - 1) // 4095: the first and the last element included.
    assert s_big.shape == (4096,)
    idx = torch.arange(4096) * 9999 // 4095
    assert torch.equal(s_big, idx.double()) and s_big[0] == 0 and s_big[-1] == 9999
    assert s_none is None and s_empty is None


def same(outputs, a, b, tolerances=F32, slack=()):
    sa = outputs._output_sample([torch.tensor(a, dtype=torch.float32)] if not isinstance(a, tuple) else list(a))
    sb = outputs._output_sample([torch.tensor(b, dtype=torch.float32)] if not isinstance(b, tuple) else list(b))
    return outputs._same_sample(sa, sb, tolerances, list(slack))


def test_same_sample_tolerance_is_relative_to_the_first(outputs):
    # atol 1e-4 + rtol 1e-4 * |a|: 2e-4 around 1, 0.0101 around 100.
    assert same(outputs, [1.0, 100.0], [1.00015, 100.0095]) == (True, "")
    ok, what = same(outputs, [1.0, 100.0, 3.0], [1.00025, 100.0, 3.0])
    assert not ok and what == "output 0: 1 of 3 sampled elements differ (first: 1, then 1.00025)"
    ok, what = same(outputs, [1.0, 100.0], [1.0, 100.0105])
    assert not ok and what == "output 0: 1 of 2 sampled elements differ (first: 100, then 100.01)"


def test_same_sample_slack_widens_atol_per_output(outputs):
    a = (torch.tensor([1.0]), torch.tensor([1.0]))
    b = (torch.tensor([1.3]), torch.tensor([1.3]))
    assert not same(outputs, a, b)[0]
    assert not same(outputs, a, b, slack=[0.5])[0]           # the second output has none
    assert same(outputs, a, b, slack=[0.5, 0.5]) == (True, "")


def test_same_sample_nan_and_structure(outputs):
    assert same(outputs, [math.nan, 1.0], [math.nan, 1.0]) == (True, "")
    ok, what = same(outputs, [math.nan, 1.0], [0.0, 1.0])
    assert not ok and what.startswith("output 0: 1 of 2 sampled elements differ")
    assert same(outputs, [math.inf], [math.inf]) == (True, "")
    assert outputs._same_sample([None, None], [None], F32, []) == (False, "2 outputs, then 1")
    s3, s4 = outputs._output_sample([torch.ones(3)]), outputs._output_sample([torch.ones(4)])
    assert outputs._same_sample(s3, s4, F32, []) == (False, "output 0: another size")
    assert outputs._same_sample([None], s3, F32, []) == (True, "")   # not a tensor: not compared


def test_same_sample_infinities_equal_only_themselves(outputs):
    # An infinite first value once made its bound atol + rtol * |a| infinite, so anything passed.
    assert not same(outputs, [math.inf], [-math.inf])[0]
    assert not same(outputs, [math.inf], [1.0])[0]


# ------------------------------------------------------------------------------------------------
# The timed outputs' check (timing.py).

class Rounds:
    """What the timed outputs' check is given: a stand-in Worker on the CPU path (no harness
    kernels), the job's tolerances, the timing's state and its round checks."""

    def __init__(self, timing, kinds):
        self.timing = timing
        self.w = types.SimpleNamespace(kind=kinds["cpu"])
        self.job = types.SimpleNamespace(tolerances={torch.float32: F32, torch.float16: (1e-2, 1e-2)})
        self.state = timing.TimingState(can_spin=False)
        self.checks = timing.RoundChecks(torch.Generator().manual_seed(0), random.Random(0).getrandbits)

    def tolerance(self, dtype, i):
        return self.timing.tolerance(self.job, self.state, dtype, i)

    def check_round_outputs(self, ref, snap, k):
        self.timing.check_round_outputs(self.w, self.job, self.state, self.checks, ref, snap, k)

    def check_round_fracs(self):
        self.timing.check_round_fracs(self.w, self.checks)


@pytest.fixture
def rounds(timing, harness):
    return Rounds(timing, harness["device"].KINDS)


def test_tolerance_per_dtype_and_output(rounds):
    rounds.state.cur_slack = [0.5]
    assert rounds.tolerance(torch.float32, 0) == (0.5001, 1e-4)
    assert rounds.tolerance(torch.float32, 1) == F32
    assert rounds.tolerance(torch.int32, 0) == (0.0, 0.0)   # exact: no slack either


def check(rounds, outputs, ref, cand, k=3, where=None):
    flat = cand.reshape(-1)
    values = flat if where is None else flat[where] if isinstance(where, slice) else flat.index_select(0, where)
    snap = [outputs._Taken(values.clone(), where, tuple(cand.shape), cand.dtype)]
    rounds.check_round_outputs(ref, snap, k)
    rounds.check_round_fracs()


def test_infinities_in_timed_outputs_equal_only_themselves(rounds, outputs, channel):
    ref = torch.tensor([math.inf, -math.inf])
    check(rounds, outputs, ref, ref.clone())
    for cand in ([math.inf, math.inf], [1.0, -math.inf], [math.nan, -math.inf]):
        with pytest.raises(channel._Done):
            check(rounds, outputs, ref, torch.tensor(cand))


def test_timed_outputs_within_the_tolerance_pass(rounds, outputs):
    ref = torch.tensor([1.0, 100.0, math.nan, math.inf, -2.0])
    check(rounds, outputs, ref, torch.tensor([1.00015, 100.0095, math.nan, math.inf, -2.0002]))
    check(rounds, outputs, torch.arange(6, dtype=torch.int32), torch.arange(6, dtype=torch.int32))
    assert rounds.checks.round_fracs == []


@pytest.mark.parametrize("cand, bad", [
    ([1.00025, 100.0, 0.0], 1),            # beyond atol + rtol |ref| = 2e-4
    ([1.0, 100.0105, 0.0], 1),             # beyond 0.0101
    ([1.0, 100.0, math.nan], 1),           # NaN where the reference has none
    ([1.0, 100.0, math.inf], 1),           # an infinity where the reference is finite
    ([2.0, 0.0, 5.0], 3),
])
def test_timed_outputs_beyond_the_tolerance_are_refused(rounds, outputs, channel, cand, bad):
    with pytest.raises(channel._Done) as e:
        check(rounds, outputs, torch.tensor([1.0, 100.0, 0.0]), torch.tensor(cand), k=7)
    assert e.value.status == "rejected" and e.value.checks == ["runtime:timing_outputs"]
    assert e.value.message == (
        "timing round 7: the candidate's output differs from the reference's on the same inputs "
        f"({bad} of 3 checked elements of output 0 beyond the correctness tolerance); every timed call is "
        "checked like a correctness trial")


def test_the_rounding_slack_widens_the_timed_check(rounds, outputs, channel):
    rounds.state.cur_slack = [0.5]
    check(rounds, outputs, torch.tensor([1.0, 2.0]), torch.tensor([1.4, 2.5]))
    with pytest.raises(channel._Done):
        check(rounds, outputs, torch.tensor([1.0, 2.0]), torch.tensor([1.4, 2.6]))


def test_integer_timed_outputs_are_exact(rounds, outputs, channel):
    with pytest.raises(channel._Done):
        check(rounds, outputs, torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4]))


def test_only_the_sampled_positions_are_compared(rounds, outputs, channel):
    ref = torch.zeros(10)
    cand = torch.zeros(10)
    cand[9] = 1.0
    check(rounds, outputs, ref, cand, where=slice(0, 5))
    check(rounds, outputs, ref, cand, where=torch.tensor([0, 3, 8]))
    with pytest.raises(channel._Done):
        check(rounds, outputs, ref, cand, where=torch.tensor([1, 9]))


def test_timed_outputs_of_another_shape_or_kind(rounds, outputs, channel):
    for ref, snap, detail in [
        (torch.zeros(4), [outputs._Taken(torch.zeros(4), None, (2, 2), torch.float32)],
         "an output of another shape or dtype"),
        (torch.zeros(4), [outputs._Taken(torch.zeros(4), None, (4,), torch.float16)],
         "an output of another shape or dtype"),
        ((torch.zeros(4), torch.zeros(1)), [outputs._Taken(torch.zeros(4), None, (4,), torch.float32)],
         "a different number of outputs"),
        (torch.zeros(4), [None], "an output of another type"),
    ]:
        with pytest.raises(channel._Done) as e:
            rounds.check_round_outputs(ref, snap, 0)
        assert f"({detail})" in e.value.message


# ------------------------------------------------------------------------------------------------
# Warm-up.

def test_settled(timing):
    assert not timing._settled([10.0, 10.0])                        # fewer than three
    assert timing._settled([12.0, 10.5, 10.2, 10.1])                # median of last 3: 10.2 <= 1.03 * 10.1
    assert not timing._settled([10.0, 12.0, 12.0, 12.0])            # 12 > 10.3
    assert timing._settled([10.0, 10.3, 50.0, 10.0])                # one outlier: the median is 10.3
    assert not timing._settled([10.0, 10.31, 50.0, 10.4])
