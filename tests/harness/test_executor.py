"""executor.py's constructor parameters as data (_param_descs) and the candidate worker's
hyperparameter check against them (signature_mismatch): number, kinds and defaults compared,
positional parameters free to be renamed, keyword-only ones not."""
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


def mismatch(executor, ref_cls, cand_cls):
    # The reference's descriptions arrive through JSON (reference_info).
    w = types.SimpleNamespace(reference=types.SimpleNamespace(
        signature=json.loads(json.dumps(executor._param_descs(ref_cls)))))
    return executor._ExecutorPhase.signature_mismatch(w, cand_cls)


def test_the_same_signature_and_renamed_positional_parameters_pass(executor):
    class Same(torch.nn.Module):
        def __init__(self, dim, eps=1e-5, *, mode="mean", dtype=torch.float32, sizes=(1, 2)):
            super().__init__()

    class Renamed(torch.nn.Module):
        def __init__(self, d, epsilon=1e-5, *, mode="mean", dtype=torch.float32, sizes=(1, 2)):
            super().__init__()

    assert mismatch(executor, Model, Same) is None
    assert mismatch(executor, Model, Renamed) is None


def test_other_signatures_are_named(executor):
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

    assert mismatch(executor, Model, OtherDefault) == (
        "ModelNew.__init__(dim, eps=1e-06, mode=mean, dtype=torch.float32, sizes=[1, 2]) differs from " + want)
    assert mismatch(executor, Model, RenamedKeyword) == (
        "ModelNew.__init__(dim, eps=1e-05, how=mean, dtype=torch.float32, sizes=[1, 2]) differs from " + want)
    assert mismatch(executor, Model, Fewer) == "ModelNew.__init__(dim, eps=1e-05) differs from " + want
    assert mismatch(executor, Model, Varargs) == "ModelNew.__init__(args, kwargs) differs from " + want


def test_no_reference_signature_no_check(executor):
    assert executor._ExecutorPhase.signature_mismatch(
        types.SimpleNamespace(reference=types.SimpleNamespace(signature=None)), Model) is None
