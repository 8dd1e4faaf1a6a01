"""What the phases pass one another, as data (env/eval/harness/README.md, "The phases' data"): the job
(job.py: Job, parse_job), what the reference phase found (reference.py: Reference, Baseline; its
reference_info across the trust boundary), what the trials made of the candidate (trials.py:
Candidate) and the timing commands' state (executor.py: ExecutorState). Each is a class with __slots__: no instance
dictionary, so nothing can be added to one or shadow one of its methods, and its class is in the
integrity snapshot like every class of the harness. The phases are functions over that data, given
the Worker (`w`) for the process's side of a job only. The last tests read the harness's source:
every field a phase reads of one of these objects is one of its fields; every attribute a phase
reads of the Worker is one the Worker or a phase sets, every one a phase sets is one the Worker
sets itself, and none holds a phase's data; and every call of a phase function passes each data
object under its own name."""
import ast
import json
import types

import pytest
import torch

from conftest import HARNESS_DIR, OWN_MODULES

JOB = {"type": "job", "seed": 11, "tolerances": {"float32": [1e-4, 2e-4], "float16": [1e-2, 1e-2]}, "trials": 5,
       "rounding_factor": 8.0, "baseline": "eager", "placement_jitter_bytes": 4096, "quiet_gc": True, "eval_mode": False,
       "candidate_source": "C", "task_source": "T", "reference_only": False, "static_checks": True,
       "outputs": "host", "peaks": False, "role": "reference"}


# The harness's kinds of device by name (device.py's KINDS), for parse_job.
KIND = {}


@pytest.fixture(scope="module")
def job(harness):
    KIND.update(harness["device"].KINDS)
    return harness["job"]


def test_parse_job_reads_every_field(job):
    j = job.parse_job(dict(JOB), KIND["cpu"])
    assert (j.seed, j.trials, j.rounding_factor, j.baseline, j.jitter_bytes) == (11, 5, 8.0, "eager", 4096)
    assert j.tolerances == {torch.float32: (1e-4, 2e-4), torch.float16: (1e-2, 1e-2)}
    assert (j.quiet_gc, j.eval_mode) == (True, False)
    assert (j.role, j.candidate_source, j.task_source, j.reference_only, j.static) == ("reference", "C", "T", False, True)
    assert j.outputs_on_device is False and not j.candidate_side
    assert j.peaks is False and job.parse_job(dict(JOB, peaks=True), KIND["cpu"]).peaks is True
    # Clamped as the worker always clamped them.
    j = job.parse_job(dict(JOB, rounding_factor=-1, placement_jitter_bytes=-5), KIND["cpu"])
    assert (j.rounding_factor, j.jitter_bytes) == (0.0, 0)


def test_the_candidate_side_has_no_task_tolerances_or_rounding(job):
    msg = {k: v for k, v in JOB.items() if k not in ("tolerances", "rounding_factor", "task_source")}
    j = job.parse_job(dict(msg, role="candidate"), KIND["cpu"])
    assert j.candidate_side and j.tolerances == {} and j.rounding_factor == 0.0 and j.task_source == ""


def test_a_check_of_the_task_alone_runs_no_static_checks(job):
    alone = {k: v for k, v in JOB.items() if k != "role"}
    assert job.parse_job(dict(alone, reference_only=True), KIND["cpu"]).static is False
    assert job.parse_job(dict(JOB, static_checks=False), KIND["cpu"]).static is False


def test_outputs_stay_on_the_device_only_on_cuda_and_when_asked(job):
    msg = {k: v for k, v in JOB.items() if k != "outputs"}
    assert job.parse_job(msg, KIND["cpu"]).outputs_on_device is False        # not read on the CPU
    assert job.parse_job(dict(JOB, outputs="device"), KIND["cuda"]).outputs_on_device is True
    assert job.parse_job(dict(JOB, outputs="host"), KIND["cuda"]).outputs_on_device is False


# (A job without `role` is a check of the task alone: test_a_job_without_a_role_is_only_...)
@pytest.mark.parametrize("key", [k for k in JOB if k not in ("type", "role")])
def test_a_missing_field_ends_the_job_naming_it(job, channel, key):
    msg = {k: v for k, v in JOB.items() if k != key}
    if key == "outputs":
        with pytest.raises(channel._Done) as e:
            job.parse_job(msg, KIND["cuda"])
    else:
        with pytest.raises(channel._Done) as e:
            job.parse_job(msg, KIND["cpu"])
    assert e.value.status == "runtime_error"
    assert e.value.message == f"the evaluator's 'job' message lacks {key!r}"


def test_the_first_missing_field_is_named_in_the_order_the_worker_reads(job, channel):
    with pytest.raises(channel._Done) as e:
        job.parse_job({"type": "job"}, KIND["cpu"])
    assert e.value.message == "the evaluator's 'job' message lacks 'seed'"
    with pytest.raises(channel._Done) as e:   # the baseline is checked before the role is read
        job.parse_job(dict(JOB, baseline="fast", role="judge"), KIND["cpu"])
    assert e.value.message == "unknown baseline 'fast'"


def test_a_job_without_a_role_is_only_a_check_of_the_task_alone(job, channel):
    # One process never runs both the reference and a candidate (docs/evaluator.md, Trust boundary).
    alone = {k: v for k, v in JOB.items() if k != "role"}
    assert job.parse_job(dict(alone, reference_only=True), KIND["cpu"]).role is None
    with pytest.raises(channel._Done) as e:
        job.parse_job(alone, KIND["cpu"])
    assert e.value.status == "runtime_error"
    assert e.value.message == "a job without a role must be a check of the task alone (reference_only)"


def test_baseline_and_role_are_checked(job, channel):
    for msg, device, text in [(dict(JOB, baseline="cuda-graph"), "cpu",
                               "the cuda-graph baseline needs a CUDA device; this worker runs on the CPU"),
                              (dict(JOB, role="judge"), "cpu", "unknown role 'judge'")]:
        with pytest.raises(channel._Done) as e:
            job.parse_job(msg, KIND[device])
        assert e.value.status == "runtime_error" and e.value.message == text
    assert job.parse_job(dict(JOB, baseline="cuda-graph"), KIND["cuda"]).baseline == "cuda-graph"
    assert job.parse_job(dict(JOB, role="reference"), KIND["cpu"]).role == "reference"


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
    assert (b.model, b.fn, b.mark_step) == (m, m, None)


def _data_classes(harness):
    return {"Job": harness["job"].Job, "Reference": harness["reference"].Reference,
            "Baseline": harness["reference"].Baseline, "Candidate": harness["trials"].Candidate,
            "ExecutorState": harness["executor"].ExecutorState}


def _instances(harness):
    r = harness["reference"]
    return [harness["job"].parse_job(dict(JOB), harness["device"].CPU), r.Reference(1), r.Baseline(), harness["trials"].Candidate(),
            harness["executor"].ExecutorState((1, 1))]


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


def test_the_worker_takes_no_phase_from_a_class(worker):
    # The phases are functions of the harness's modules, over explicit data (README, "The
    # phases' data"); the Worker is the process's side of a job only.
    assert worker.Worker.__bases__ == (object,)
    assert worker.Worker.__mro__ == (worker.Worker, object)
    assert worker._WORKER_METHODS == {k for k, v in vars(worker.Worker).items() if callable(v)}
    for name in ("load_phase", "trial_phase", "executor_loop", "profiled", "call_candidate", "placed"):
        assert not hasattr(worker.Worker, name), name


# ------------------------------------------------------------------------------------------------
# The harness's source: what a phase reads of these objects and of the Worker.

# The names the phases give the data objects (parameters and locals), by module; `job` is the Job
# in every module. In reference.py `ref` is the task's Model and `r` the Reference.
_NAMES = {
    "worker": {"ref": "Reference", "baseline": "Baseline", "cand": "Candidate"},
    "reference": {"r": "Reference"},
    "trials": {"ref": "Reference", "cand": "Candidate"},
    "executor": {"ref": "Reference", "baseline": "Baseline", "cand": "Candidate", "state": "ExecutorState"},
}
# Where the Worker once held the phases' data, and state of one phase only: none of it is an
# attribute of the Worker any more (each is passed to the phase that uses it, or is that phase's).
_NOT_THE_WORKERS = {"job", "reference", "baseline", "candidate", "rounds", "checks", "watch", "flush_buf",
                    "flush_sum", "buf_sets", "sample_outs", "arena", "draw_arena", "null_out", "clock_words",
                    "check_due", "threads_before"}


def _sources():
    return {name: ast.parse((HARNESS_DIR / (name + ".py")).read_text()) for name in ("worker", *OWN_MODULES)}


def _fields(cls):
    return set(cls.__slots__) | {k for c in cls.__mro__ for k in vars(c)}


def _name_attr(node, names):
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names


def _field_problems(trees, classes):
    """Every attribute read of a data object (by the names the phases give it, and `self` in the
    data class's own methods) that is not one of its fields or methods."""
    bad = []
    for mod, tree in trees.items():
        names = dict(_NAMES.get(mod, {}), job="Job")
        own = [(c, c.name) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name in classes]
        for scope, mapping in [(tree, names)] + [(c, {"self": name}) for c, name in own]:
            for n in ast.walk(scope):
                if _name_attr(n, mapping):
                    cls = mapping[n.value.id]
                    if n.attr not in _fields(classes[cls]):
                        bad.append(f"{mod}.py line {n.lineno}: {cls} has no field {n.attr!r}")
    return bad


def _phase_functions(tree):
    """The module-level functions that take the Worker as `w`, their first parameter."""
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.args.args and n.args.args[0].arg == "w"]


def _worker_attr_problems(trees, methods):
    """What the Worker (worker.py, `self`) and the phase functions (`w`) read and set of the
    Worker: every attribute read is a method or one the Worker or a phase sets; every attribute a
    phase sets is one the Worker sets itself (no phase keeps its state on the Worker); and no
    phase's data is held by the Worker (_NOT_THE_WORKERS)."""
    worker_sets, phase_sets, read = set(), [], []
    for mod, tree in trees.items():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Worker"):
            for n in ast.walk(cls):
                if _name_attr(n, ("self",)):
                    if isinstance(n.ctx, ast.Store):
                        worker_sets.add(n.attr)
                    else:
                        read.append((mod, n.lineno, n.attr))
        for fn in _phase_functions(tree):
            for n in ast.walk(fn):
                if _name_attr(n, ("w",)):
                    (phase_sets if isinstance(n.ctx, ast.Store) else read).append((mod, n.lineno, n.attr))
    known = worker_sets | {a for _, _, a in phase_sets} | methods
    bad = [f"{m}.py line {ln}: Worker.{a} is never set" for m, ln, a in read if a not in known]
    bad += [f"{m}.py line {ln}: Worker.{a} is set by a phase, not by the Worker" for m, ln, a in phase_sets
            if a not in worker_sets]
    bad += [f"{m}.py line {ln}: Worker.{a} holds a phase's data" for m, ln, a in read + phase_sets
            if a in _NOT_THE_WORKERS]
    bad += [f"worker.py: Worker.{a} holds a phase's data" for a in sorted(worker_sets & _NOT_THE_WORKERS)]
    return bad


def test_every_field_a_phase_reads_is_one(harness):
    assert not _field_problems(_sources(), _data_classes(harness))


def test_every_worker_attribute_a_phase_reads_is_set(worker):
    trees = _sources()
    assert sum(len(_phase_functions(t)) for t in trees.values()) > 20   # the phases are functions on `w`
    assert not _worker_attr_problems(trees, {k for k in vars(worker.Worker)})


def test_the_source_checks_find_what_they_look_for(worker, harness):
    # The checks above, on the harness's source with one more function in each of two modules: a
    # read of a field no data object has, of a Worker attribute nobody sets, a phase's state kept
    # on the Worker, and the job reached through it.
    trees = _sources()
    trees["trials"].body.append(ast.parse(
        "def bad(w, job, ref, cand):\n"
        "    w.laps['x'] = ref.trials + cand.model + job.seed\n"
        "    return ref.trails, cand.modle, job.sead, w.not_set\n").body[0])
    trees["executor"].body.append(ast.parse(
        "def worse(w, state):\n"
        "    w.buffers = state.buf_sets\n"
        "    return w.job.seed, w.buffers\n").body[0])
    fields = _field_problems(trees, _data_classes(harness))
    assert sorted(p.split(": ", 1)[1] for p in fields) == [
        "Candidate has no field 'modle'", "Job has no field 'sead'", "Reference has no field 'trails'"]
    attrs = _worker_attr_problems(trees, {k for k in vars(worker.Worker)})
    assert sorted(p.split(": ", 1)[1] for p in attrs) == [
        "Worker.buffers is set by a phase, not by the Worker", "Worker.job holds a phase's data",
        "Worker.job is never set", "Worker.not_set is never set"]


def _harness_calls(trees, defs):
    """Each call of a module-level function of the harness by the name it is defined or imported
    under (relative or crucible_harness imports): (calling module, the call, (defining module,
    name)) for the keys of `defs`."""
    for mod, tree in trees.items():
        bound = {name: (mod, name) for (m, name) in defs if m == mod}
        for n in tree.body:
            if isinstance(n, ast.ImportFrom) and (n.level == 1 or (n.module or "").startswith("crucible_harness.")):
                src = n.module.removeprefix("crucible_harness.") if n.level == 0 else n.module
                bound.update({a.asname or a.name: (src, a.name) for a in n.names if (src, a.name) in defs})
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in bound:
                yield mod, n, bound[n.func.id]


def test_every_data_object_is_passed_under_its_own_name():
    # The phase functions take their data positionally, several of a kind side by side (w, job,
    # ref, baseline, cand, state, checks, watch, cache): at every call of one, by the name it is
    # defined or imported under, each such parameter gets the object of that name (the Worker
    # as `w` or, in worker.py, `self`), or None where that side has none. Many of these calls are
    # on paths a CPU test does not reach (CUDA, the boundary's roles).
    params = {"w", "job", "ref", "baseline", "cand", "state", "checks", "watch", "cache"}
    trees = _sources()
    defs = {(mod, n.name): [a.arg for a in n.args.posonlyargs + n.args.args]
            for mod, tree in trees.items() for n in tree.body if isinstance(n, ast.FunctionDef)}
    bad, checked = [], 0
    for mod, n, key in _harness_calls(trees, defs):
        names = defs[key]
        for arg, p in zip(n.args, names):
            if p not in params or isinstance(arg, ast.Starred):
                continue
            checked += 1
            ok = (isinstance(arg, ast.Constant) and arg.value is None) or (isinstance(arg, ast.Name) and (
                arg.id == p or (p == "w" and arg.id == "self" and mod == "worker")))
            if not ok:
                bad.append(f"{mod}.py line {n.lineno}: {n.func.id}() is given {ast.unparse(arg)} as {p}")
        for k in n.keywords:
            if k.arg in params and not (isinstance(k.value, ast.Name) and k.value.id == k.arg):
                bad.append(f"{mod}.py line {n.lineno}: {n.func.id}() is given {ast.unparse(k.value)} as {k.arg}")
    assert checked > 90 and not bad


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
    for mod, n, key in _harness_calls(trees, defs):
        if any(isinstance(a, ast.Starred) for a in n.args) or any(k.arg is None for k in n.keywords):
            continue
        required, most, keywords, any_kw, names = defs[key]
        given = len(n.args)
        kws = {k.arg for k in n.keywords}
        ok = (most is None or given <= most) and given + len(kws & names) >= required \
            and (any_kw or kws <= (names | keywords))
        checked += 1
        if not ok:
            bad.append(f"{mod}.py line {n.lineno}: {n.func.id}() with {given} positional, keywords {sorted(kws)}")
    assert checked > 100 and not bad
