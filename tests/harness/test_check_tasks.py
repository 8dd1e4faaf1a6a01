"""tools/check_tasks.py draws the evaluator's inputs: the worker's own make_inputs, and every
input distribution the evaluator draws for a task (INPUT_DOMAIN; 2 and 3 left out where the
reference's outputs are not finite on them, as 4 is)."""
import importlib.util
import types

import pytest
import torch

from conftest import REPO


@pytest.fixture(scope="module")
def check_tasks():
    spec = importlib.util.spec_from_file_location("crucible_check_tasks", REPO / "tools" / "check_tasks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_inputs_are_the_workers(check_tasks, reference):
    task = types.SimpleNamespace(get_inputs=lambda: [torch.randn(8, 16), torch.arange(4), 3])
    for dist in range(6):
        got = check_tasks.make_inputs(task, 77, dist, "cpu")
        want = reference.make_inputs(task, "cpu", 77, dist)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[2] == want[2]
    assert check_tasks.evaluator_worker()._OWN_MODULES["reference"].__file__ == reference.__file__


def test_distributions_by_input_domain(check_tasks):
    assert check_tasks.input_dists(types.SimpleNamespace()) == [0, 5, 2, 3, 4]
    assert check_tasks.input_dists(types.SimpleNamespace(INPUT_DOMAIN="any")) == [0, 5, 2, 3, 4]
    assert check_tasks.input_dists(types.SimpleNamespace(INPUT_DOMAIN="as-given")) == [0, 1, 4]
    with pytest.raises(RuntimeError, match="INPUT_DOMAIN is 'positive'"):
        check_tasks.input_dists(types.SimpleNamespace(INPUT_DOMAIN="positive"))
    assert check_tasks.timed_dists([0, 1, 2, 3, 4]) == [1, 2, 3, 4]
    assert check_tasks.timed_dists([0, 1, 4]) == [1, 4]
    assert check_tasks.timed_dists([0]) == [1]


def test_a_distribution_whose_reference_overflows_is_left_out(check_tasks):
    inf = [torch.tensor([1.0, float("inf")])]
    dists = [0, 1, 2, 3, 4]
    assert not check_tasks.drop_unfinite(dists, 1, inf, True)       # 2, 3 and 4 only
    assert check_tasks.drop_unfinite(dists, 3, inf, True) and dists == [0, 1, 2, 4]
    assert not check_tasks.drop_unfinite(dists, 2, inf, False)      # not finite on 0 either: kept
    assert not check_tasks.drop_unfinite(dists, 2, [torch.ones(2), 5], True)
    dists = [0, 5, 2, 3, 4]
    assert check_tasks.drop_unfinite(dists, 5, inf, True) and dists == [0, 1, 2, 3, 4]  # 5 gives way to 1


def test_distribution_5_hides_its_signs_and_scale_from_a_sample(reference):
    """Distribution 1 with a sparse few of each input's elements negated and a sparser few times
    32: a sample of 64 elements usually sees none, the whole input always holds some."""
    task = types.SimpleNamespace(get_inputs=lambda: [torch.rand(256, 256) + 0.5, torch.rand(4096) + 0.5])
    unseen = 0
    for seed in range(20):
        for t, t1 in zip(reference.make_inputs(task, "cpu", seed, 5), reference.make_inputs(task, "cpu", seed, 1)):
            flat, ratio = t.reshape(-1), (t / t1).reshape(-1)  # distribution 1's values, some negated or times 32
            assert bool(((ratio == 1) | (ratio == -1) | (ratio == 32) | (ratio == -32)).all())
            assert (flat < 0).any() and (ratio.abs() == 32).any()
            assert (flat < 0).float().mean() <= 1 / 32
            unseen += int(not (flat[torch.randperm(flat.numel())[:64]] < 0).any())
    assert unseen >= 10  # most samples of 64 see no negative value


TASK = '''
"""exp of its input: finite on the task's inputs, beyond float32 at 64 times their scale."""
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.exp(x)


def get_inputs():
    return [torch.rand(64, 64) * 1.5 + 1.0]


def get_init_inputs():
    return []
'''


def test_check_task_draws_what_the_evaluator_draws(check_tasks, tmp_path):
    path = tmp_path / "01_exp.py"
    path.write_text(TASK)
    args = check_tasks.parse_args(["--no-timing", "--in-process"])
    row, task, model = check_tasks.check_task(path, "01_exp", args)
    # x in [1, 2.5); float32's exp overflows past 88.7: distribution 2 reaches e^5, 4 e^80
    # (x 2 x 16), 3 e^160 (x 2 x 32).
    assert row["dists"] == [0, 1, 2, 4]
    (path.parent / "02_exp.py").write_text(TASK + 'INPUT_DOMAIN = "as-given"\n')
    row, _, _ = check_tasks.check_task(path.parent / "02_exp.py", "02_exp", args)
    assert row["dists"] == [0, 1, 4]
