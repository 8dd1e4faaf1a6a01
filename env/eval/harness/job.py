"""env/eval/harness/job.py: the job, as data: what the evaluator's `job` message says (env/eval/worker_messages.cpp,
docs/evaluator-protocol.md), read once by parse_job when the job arrives (Worker.run) and only read
after that, by every phase. The worker keeps no default of its own: a field the message lacks ends
the job naming it (_need)."""
import torch

from .trusted import _float, _getattr, _int, _max
from .channel import _Done, _need

_BASELINES = ("eager", "compile", "compile-reduce-overhead", "cuda-graph")
_ROLES = (None, "reference", "candidate")


class Job:
    """One job message, parsed. Its 15 fields mirror the message's (one protocol message, not
    several: splitting it would split what env/eval/worker_messages.cpp writes as one); in the order
    parse_job reads them:

    seed             the trials' inputs are drawn under seed + t, the models built under seed
    tolerances       {torch dtype: (atol, rtol)} of the correctness comparison, which every timed
                     call's outputs are held to as well ({} in the candidate worker: the
                     evaluator compares its outputs)
    trials           the correctness trials asked for (the reference phase may lower it, or the
                     candidate worker take it from the inputs it is given: Reference.trials)
    rounding_factor  outputs may differ from the reference by this many times its own rounding
                     error on the same inputs, beyond atol and rtol (0: fixed tolerances only;
                     0 in the candidate worker)
    baseline         how the reference is timed: eager, compile, compile-reduce-overhead,
                     cuda-graph (reference.py, prepare_baseline)
    jitter_bytes     each timing round's inputs start 0 to this many bytes into their own
                     allocation (docs/evaluator.md, Timing: placement)
    quiet_gc         evaluator.quiet_gc: what is alive at the job's start leaves the cyclic
                     collector's reach
    eval_mode        both models in eval mode once constructed
    role             the job's side of the trust boundary: "reference" (the task only) or
                     "candidate" (ModelNew only); None only for a check of the task alone
    candidate_source the candidate's source
    task_source      the task's source ("" in the candidate worker, which never has it)
    reference_only   a check of the task alone (device_evaluator::check_task)
    static           the static checks and the hyperparameter check run (never for a check of
                     the task alone)
    outputs_on_device CUDA, job "outputs": "device": the outputs stay on the device, exported
    peaks            the reference phase measures the hardware's peaks (reference.py,
                     measure_peaks; the evaluator's first verdict on a hardware, evaluator.limits)
    """
    __slots__ = ("seed", "tolerances", "trials", "rounding_factor", "baseline", "jitter_bytes", "quiet_gc",
                 "eval_mode", "role", "candidate_source",
                 "task_source", "reference_only", "static", "outputs_on_device", "peaks")

    def __init__(self, **fields):
        for name in Job.__slots__:
            setattr(self, name, fields.pop(name))
        if fields:
            raise TypeError(f"Job has no field {sorted(fields)[0]!r}")

    @property
    def candidate_side(self):
        """The candidate's side of the trust boundary: no task, no tolerances, no rounding."""
        return self.role == "candidate"


def parse_job(msg, kind):
    """The job message `msg` for a worker on a device of `kind` (device.py's DeviceKind), as a Job. Ends the job
    (_Done, runtime_error) on a missing field, an unknown baseline or role, a job with no role
    that is not a check of the task alone, or the cuda-graph baseline on the CPU; fields are read, and checked, in the order the worker always read them."""
    candidate_side = msg.get("role") == "candidate"
    seed = _int(_need(msg, "seed"))
    tol = {} if candidate_side else _need(msg, "tolerances")
    tolerances = {_getattr(torch, name): (_float(a), _float(r)) for name, (a, r) in tol.items()}
    trials = _int(_need(msg, "trials"))
    rounding_factor = 0.0 if candidate_side else _max(_float(_need(msg, "rounding_factor")), 0.0)
    baseline = _need(msg, "baseline")
    jitter_bytes = _max(_int(_need(msg, "placement_jitter_bytes")), 0)
    quiet_gc = _need(msg, "quiet_gc") is True
    eval_mode = _need(msg, "eval_mode") is True
    if baseline not in _BASELINES:
        raise _Done("runtime_error", (), f"unknown baseline {baseline!r}")
    if baseline == "cuda-graph" and not kind.graphs:
        raise _Done("runtime_error", (), f"the cuda-graph baseline needs a CUDA device; this worker runs on the {kind.name.upper()}")
    role = msg.get("role")
    if role not in _ROLES:
        raise _Done("runtime_error", (), f"unknown role {role!r}")
    candidate_source = _need(msg, "candidate_source")
    task_source = "" if candidate_side else _need(msg, "task_source")
    reference_only = _need(msg, "reference_only") is True
    if role is None and not reference_only:
        # Every verdict has two workers (docs/evaluator.md, Trust boundary): one process never
        # runs both the reference and a candidate.
        raise _Done("runtime_error", (), "a job without a role must be a check of the task alone (reference_only)")
    static = _need(msg, "static_checks") is True and not reference_only
    outputs_on_device = kind.exports and _need(msg, "outputs") == "device"
    peaks = _need(msg, "peaks") is True
    return Job(seed=seed, tolerances=tolerances, trials=trials, rounding_factor=rounding_factor, baseline=baseline,
               jitter_bytes=jitter_bytes, quiet_gc=quiet_gc, eval_mode=eval_mode, role=role,
               candidate_source=candidate_source, task_source=task_source, reference_only=reference_only,
               static=static, outputs_on_device=outputs_on_device, peaks=peaks)
