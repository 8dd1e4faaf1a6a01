"""What the phases pass one another, as data (env/harness/README.md, "The phases' data"): the job
(job.py: Job, parse_job), what the reference phase found (reference.py: Reference, Baseline; its
reference_info across the trust boundary), what the trials made of the candidate (trials.py:
Candidate) and the timing's state (timing.py: TimingState, RoundChecks, ThreadWatch). Each is a
class with __slots__: no instance dictionary, so nothing can be added to one or shadow one of its
methods, and its class is in the integrity snapshot like every class of the harness. The last
tests read the harness's source: every field a phase reads of one of these objects is one of its
fields, and every attribute a phase reads of the Worker is one the Worker or a phase sets."""
import ast
import json
import types

import pytest
import torch

from conftest import HARNESS_DIR, OWN_MODULES

JOB = {"type": "job", "seed": 11, "tolerances": {"float32": [1e-4, 2e-4], "float16": [1e-2, 1e-2]}, "trials": 5,
       "rounding_factor": 8.0, "baseline": "eager", "flush_bytes": 1 << 20, "placement_jitter_bytes": 4096,
       "timing_reserve": True, "sample_ms": 2.5, "max_calls": 64, "quiet_gc": True, "eval_mode": False,
       "candidate_source": "C", "task_source": "T", "reference_only": False, "static_checks": True,
       "outputs": "host"}


@pytest.fixture(scope="module")
def job(harness):
    return harness["job"]


def test_parse_job_reads_every_field(job):
    j = job.parse_job(dict(JOB), "cpu")
    assert (j.seed, j.trials, j.rounding_factor, j.baseline, j.flush_bytes, j.jitter_bytes) == (11, 5, 8.0, "eager",
                                                                                                 1 << 20, 4096)
    assert j.tolerances == {torch.float32: (1e-4, 2e-4), torch.float16: (1e-2, 1e-2)}
    assert (j.timing_reserve, j.sample_ms, j.max_calls, j.quiet_gc, j.eval_mode) == (True, 2.5, 64, True, False)
    assert (j.role, j.candidate_source, j.task_source, j.reference_only, j.static) == (None, "C", "T", False, True)
    assert j.outputs_on_device is False and not j.candidate_side
    # Clamped as the worker always clamped them.
    j = job.parse_job(dict(JOB, rounding_factor=-1, placement_jitter_bytes=-5, sample_ms=-1, max_calls=0), "cpu")
    assert (j.rounding_factor, j.jitter_bytes, j.sample_ms, j.max_calls) == (0.0, 0, 0.0, 1)


def test_the_candidate_side_has_no_task_tolerances_or_rounding(job):
    msg = {k: v for k, v in JOB.items() if k not in ("tolerances", "rounding_factor", "task_source")}
    j = job.parse_job(dict(msg, role="candidate"), "cpu")
    assert j.candidate_side and j.tolerances == {} and j.rounding_factor == 0.0 and j.task_source == ""


def test_a_check_of_the_task_alone_runs_no_static_checks(job):
    assert job.parse_job(dict(JOB, reference_only=True), "cpu").static is False
    assert job.parse_job(dict(JOB, static_checks=False), "cpu").static is False


def test_outputs_stay_on_the_device_only_on_cuda_and_when_asked(job):
    msg = {k: v for k, v in JOB.items() if k != "outputs"}
    assert job.parse_job(msg, "cpu").outputs_on_device is False        # not read on the CPU
    assert job.parse_job(dict(JOB, outputs="device"), "cuda").outputs_on_device is True
    assert job.parse_job(dict(JOB, outputs="host"), "cuda").outputs_on_device is False


@pytest.mark.parametrize("key", [k for k in JOB if k != "type"])
def test_a_missing_field_ends_the_job_naming_it(job, channel, key):
    msg = {k: v for k, v in JOB.items() if k != key}
    if key == "outputs":
        with pytest.raises(channel._Done) as e:
            job.parse_job(msg, "cuda")
    else:
        with pytest.raises(channel._Done) as e:
            job.parse_job(msg, "cpu")
    assert e.value.status == "runtime_error"
    assert e.value.message == f"the evaluator's 'job' message lacks {key!r}"


def test_the_first_missing_field_is_named_in_the_order_the_worker_reads(job, channel):
    with pytest.raises(channel._Done) as e:
        job.parse_job({"type": "job"}, "cpu")
    assert e.value.message == "the evaluator's 'job' message lacks 'seed'"
    with pytest.raises(channel._Done) as e:   # the baseline is checked before the role is read
        job.parse_job(dict(JOB, baseline="fast", role="judge"), "cpu")
    assert e.value.message == "unknown baseline 'fast'"


def test_baseline_and_role_are_checked(job, channel):
    for msg, device, text in [(dict(JOB, baseline="cuda-graph"), "cpu",
                               "the cuda-graph baseline needs a CUDA device; this worker runs on the CPU"),
                              (dict(JOB, role="judge"), "cpu", "unknown role 'judge'")]:
        with pytest.raises(channel._Done) as e:
            job.parse_job(msg, device)
        assert e.value.status == "runtime_error" and e.value.message == text
    assert job.parse_job(dict(JOB, baseline="cuda-graph"), "cuda").baseline == "cuda-graph"
    assert job.parse_job(dict(JOB, role="reference"), "cpu").role == "reference"


def test_reference_info_crosses_the_boundary_and_back(reference):
    r = reference.Reference(5)
    r.task = types.SimpleNamespace()
    r.trials, r.dists, r.trial_dists = 3, [0, 1, 4], [0, 1, 4]
    r.init_inputs, r.aliased = (64, 0.5), [1, 0]
    r.profile, r.kernel_mode = {"ops": 3, "kernels": {}, "operators": {"aten::mm": 1}}, "ops"
    r.round_slack, r.input_template = {0: [0.25]}, [{"dtype": "float32", "shape": [4]}]
    sig = [["dim", "POSITIONAL_OR_KEYWORD", None]]
    info = json.loads(json.dumps(r.info(sig)))   # as the evaluator passes it on
    assert info == {"type": "reference_info", "init_inputs": [64, 0.5], "signature": sig,
                    "ref_profile": r.profile, "kernel_mode": "ops", "ref_aliased": [True, False],
                    "trial_dists": [0, 1, 4], "dists": [0, 1, 4]}
    c = reference.Reference.from_info(info, 5)
    assert (c.init_inputs, c.signature, c.profile, c.kernel_mode) == ([64, 0.5], sig, r.profile, "ops")
    assert (c.aliased, c.trial_dists, c.trials) == ([True, False], [0, 1, 4], 5)
    # What the candidate's worker is not told: the task, its slack, its distributions (it draws
    # no inputs); its trials' inputs come with the `inputs` messages.
    assert (c.task, c.round_slack, c.dists, c.given_inputs, c.input_template) == (None, {}, [0, 1], None, None)


def test_a_reference_info_without_optional_fields(reference):
    c = reference.Reference.from_info({"type": "reference_info"}, 2)
    assert (c.init_inputs, c.aliased, c.trial_dists, c.profile, c.kernel_mode, c.signature) == ([], [], [], None,
                                                                                               None, None)


def test_prepare_baseline_eager_is_the_model(reference):
    m = torch.nn.Identity()
    b = reference.prepare_baseline(types.SimpleNamespace(), types.SimpleNamespace(baseline="eager"), m, [])
    assert (b.model, b.fn, b.graph, b.mark_step) == (m, m, None, None)


def _data_classes(harness):
    return {"Job": harness["job"].Job, "Reference": harness["reference"].Reference,
            "Baseline": harness["reference"].Baseline, "Candidate": harness["trials"].Candidate,
            "TimingState": harness["timing"].TimingState, "RoundChecks": harness["timing"].RoundChecks,
            "ThreadWatch": harness["timing"].ThreadWatch}


def _instances(harness):
    t, r = harness["timing"], harness["reference"]
    return [harness["job"].parse_job(dict(JOB), "cpu"), r.Reference(1), r.Baseline(), harness["trials"].Candidate(),
            t.TimingState(False), t.RoundChecks(None, None), t.ThreadWatch()]


def test_the_data_objects_take_no_new_attributes(harness):
    for obj in _instances(harness):
        assert not hasattr(obj, "__dict__"), type(obj).__name__
        with pytest.raises(AttributeError):
            obj.not_a_field = 1
    j = _instances(harness)[0]
    with pytest.raises(AttributeError):
        j.candidate_side = True                   # a property: not to be shadowed either


def test_the_data_classes_are_in_the_integrity_snapshot(worker, harness):
    snap = worker._core_snapshot(worker._HARNESS_NAMESPACES)
    labels = {e[0] for e in snap.entries}
    for name, cls in _data_classes(harness).items():
        assert f"{cls.__module__}.{name}" in labels


# ------------------------------------------------------------------------------------------------
# The harness's source: what a phase reads of these objects and of the Worker.

# The Worker's attributes that hold each data object, and the names the phase functions give them.
_HELD = {"job": "Job", "reference": "Reference", "baseline": "Baseline", "candidate": "Candidate",
         "rounds": "TimingState", "checks": "RoundChecks", "watch": "ThreadWatch"}
_LOCAL = {"job": "Job", "r": "Reference"}
_WORKER_CLASSES = ("Worker", "_TrialPhase", "_TimingPhase", "_ExecutorPhase")


def _sources():
    return {name: ast.parse((HARNESS_DIR / (name + ".py")).read_text()) for name in ("worker", *OWN_MODULES)}


def _fields(cls):
    return set(cls.__slots__) | {k for c in cls.__mro__ for k in vars(c)}


def _self_attr(node):
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def test_every_field_a_phase_reads_is_one(harness):
    classes = _data_classes(harness)
    bad = []
    for mod, tree in _sources().items():
        for n in ast.walk(tree):
            if not isinstance(n, ast.Attribute):
                continue
            if _self_attr(n.value) and n.value.attr in _HELD:
                cls = _HELD[n.value.attr]
            elif isinstance(n.value, ast.Name) and n.value.id in _LOCAL and mod == "reference":
                cls = _LOCAL[n.value.id]
            elif isinstance(n.value, ast.Name) and n.value.id == "job" and mod != "worker":
                cls = "Job"
            else:
                continue
            if n.attr not in _fields(classes[cls]):
                bad.append(f"{mod}.py line {n.lineno}: {cls} has no field {n.attr!r}")
    assert not bad


def test_every_worker_attribute_a_phase_reads_is_set(worker):
    # What Worker and its phases (and the phase functions, through `w`) read of the Worker: a
    # method, or an attribute that one of them sets.
    trees = _sources()
    methods = {k for c in worker.Worker.__mro__ for k in vars(c)}
    set_, read = [], []
    for mod, tree in trees.items():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name in _WORKER_CLASSES):
            for n in ast.walk(cls):
                if _self_attr(n):
                    (set_ if isinstance(n.ctx, ast.Store) else read).append((mod, n.lineno, n.attr))
        if mod == "reference":
            read += [(mod, n.lineno, n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                     and isinstance(n.value, ast.Name) and n.value.id == "w"]
    assigned = {a for _, _, a in set_}
    bad = [f"{m}.py line {ln}: Worker.{a} is never set" for m, ln, a in read if a not in assigned | methods]
    assert not bad


def test_every_call_of_a_harness_function_fits_its_parameters():
    # The phase functions run on paths a CPU test does not reach (CUDA, the boundary's roles):
    # each call of a module-level function of the harness, by the name it is defined or imported
    # under, passes as many positional arguments as it takes and only keywords it names.
    trees = _sources()
    defs = {}
    for mod, tree in trees.items():
        for n in tree.body:
            if isinstance(n, ast.FunctionDef):
                a = n.args
                names = [p.arg for p in a.posonlyargs + a.args]
                required = len(names) - len(a.defaults)
                defs[(mod, n.name)] = (required, None if a.vararg else len(names),
                                       set(names[required:] if a.kwarg is None else ()) | {p.arg for p in a.kwonlyargs},
                                       a.kwarg is not None, set(names))
    bad, checked = [], 0
    for mod, tree in trees.items():
        bound = {name: (mod, name) for (m, name) in defs if m == mod}
        for n in tree.body:
            if isinstance(n, ast.ImportFrom) and (n.level == 1 or (n.module or "").startswith("crucible_harness.")):
                src = n.module.removeprefix("crucible_harness.") if n.level == 0 else n.module
                bound.update({a.asname or a.name: (src, a.name) for a in n.names if (src, a.name) in defs})
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in bound):
                continue
            if any(isinstance(a, ast.Starred) for a in n.args) or any(k.arg is None for k in n.keywords):
                continue
            required, most, keywords, any_kw, names = defs[bound[n.func.id]]
            given = len(n.args)
            kws = {k.arg for k in n.keywords}
            ok = (most is None or given <= most) and given + len(kws & names) >= required \
                and (any_kw or kws <= (names | keywords))
            checked += 1
            if not ok:
                bad.append(f"{mod}.py line {n.lineno}: {n.func.id}() with {given} positional, keywords {sorted(kws)}")
    assert checked > 100 and not bad
