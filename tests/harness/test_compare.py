"""The comparison inside the worker: outputs.py's _output_sample/_same_sample, the reference's
determinism check (|a - b| <= atol + rtol |b|, NaN matching NaN). Every candidate's outputs are
compared by the evaluator (env/eval/compare.cpp)."""
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
