"""The constructor parameters as data that executor.py's reference_info sends (_param_descs, in
trials.py) and the candidate worker's hyperparameter check against them (trials.py,
signature_mismatch): number, kinds and defaults compared, positional parameters free to be
renamed, keyword-only ones not."""
import json
import types

import torch


class Model(torch.nn.Module):
    def __init__(self, dim, eps=1e-5, *, mode="mean", dtype=torch.float32, sizes=(1, 2)):
        super().__init__()


def test_param_descs(executor):
    assert executor._param_descs(Model) == [
        ["dim", "POSITIONAL_OR_KEYWORD", None],
        ["eps", "POSITIONAL_OR_KEYWORD", {"value": 1e-5}],
        ["mode", "KEYWORD_ONLY", {"value": "mean"}],
        ["dtype", "KEYWORD_ONLY", {"repr": "torch.float32"}],
        ["sizes", "KEYWORD_ONLY", {"value": (1, 2)}],
    ]


def mismatch(executor, trials, ref_cls, cand_cls):
    # The reference's descriptions arrive through JSON (reference_info), in the candidate
    # worker's Reference.
    ref = types.SimpleNamespace(signature=json.loads(json.dumps(executor._param_descs(ref_cls))))
    return trials.signature_mismatch(ref, cand_cls)


def test_the_same_signature_and_renamed_positional_parameters_pass(executor, trials):
    class Same(torch.nn.Module):
        def __init__(self, dim, eps=1e-5, *, mode="mean", dtype=torch.float32, sizes=(1, 2)):
            super().__init__()

    class Renamed(torch.nn.Module):
        def __init__(self, d, epsilon=1e-5, *, mode="mean", dtype=torch.float32, sizes=(1, 2)):
            super().__init__()

    assert mismatch(executor, trials, Model, Same) is None
    assert mismatch(executor, trials, Model, Renamed) is None


def test_other_signatures_are_named(executor, trials):
    want = "Model.__init__(dim, eps=1e-05, mode=mean, dtype=torch.float32, sizes=[1, 2])"

    class OtherDefault(torch.nn.Module):
        def __init__(self, dim, eps=1e-6, *, mode="mean", dtype=torch.float32, sizes=(1, 2)):
            super().__init__()

    class RenamedKeyword(torch.nn.Module):
        def __init__(self, dim, eps=1e-5, *, how="mean", dtype=torch.float32, sizes=(1, 2)):
            super().__init__()

    class Fewer(torch.nn.Module):
        def __init__(self, dim, eps=1e-5):
            super().__init__()

    class Varargs(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()

    assert mismatch(executor, trials, Model, OtherDefault) == (
        "ModelNew.__init__(dim, eps=1e-06, mode=mean, dtype=torch.float32, sizes=[1, 2]) differs from " + want)
    assert mismatch(executor, trials, Model, RenamedKeyword) == (
        "ModelNew.__init__(dim, eps=1e-05, how=mean, dtype=torch.float32, sizes=[1, 2]) differs from " + want)
    assert mismatch(executor, trials, Model, Fewer) == "ModelNew.__init__(dim, eps=1e-05) differs from " + want
    assert mismatch(executor, trials, Model, Varargs) == "ModelNew.__init__(args, kwargs) differs from " + want


def test_no_reference_signature_no_check(trials):
    assert trials.signature_mismatch(types.SimpleNamespace(signature=None), Model) is None
