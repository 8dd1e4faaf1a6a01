"""env/eval/harness/reference.py: the reference phase of a job (reference_phase, after the static
checks and before any candidate code): the task's Model run on each trial's inputs, drawn here
(make_inputs, for every phase), its outputs sent to the evaluator and then poisoned, the float64
copy that measures its rounding, its profiled call (profiled, which start-up and the trials count
kernels with too), and the timing baseline prepared. It returns what it found as data: a
Reference (what the trials, the timing and the candidate's worker need of it) and a Baseline (the
reference as the timing calls it)."""
import copy
import warnings

import torch

from .trusted import (
    _bool, _BaseException, _cuda_empty_cache, _cuda_synchronize, _DeviceType, _enumerate, _Ev_elapsed, _Ev_record,
    _Ev_synchronize, _float, _Generator, _getattr, _hasattr, _int, _isinstance, _len, _list, _max, _min, _os_exit,
    _perf_counter_ns, _profile, _ProfilerActivity, _range, _S_data_ptr, _setprofile, _sorted, _sum, _sys_modules,
    _T_contiguous, _T_fill_, _T_index_put_, _T_is_contiguous, _T_copy_, _T_is_floating_point, _T_lt, _T_mul, _T_mul_, _T_numel, _T_set_, _T_size, _T_to,
    _T_uniform_, _T_untyped_storage, _T_view, _Tensor, _torch_abs, _torch_device, _torch_empty, _torch_index_select,
    _torch_isfinite, _torch_manual_seed, _torch_randint, _torch_where, _tuple, _type, _uint8
)
from .device import _HarnessKernels, _kernels
try:  # torch's FLOP formulas (count_work); a torch without them counts no operations
    from torch.utils.flop_counter import flop_registry as _flop_registry
    from torch.utils._python_dispatch import TorchDispatchMode as _TorchDispatchMode
except ImportError:  # pragma: no cover - torch 2.1 and later have both
    _flop_registry, _TorchDispatchMode = None, None
from .channel import _Done, _error_done, _exc_line
from .outputs import (
    _aliased_outputs, _encode_inputs, _inputs_digest, _from_wire, _to_wire, _all_finite, _clone_inputs, _encode,
    _map_tensors, _output_items, _output_sample, _SUPPORTED_DTYPES,
    _same_sample, _tensors_in
)

_DIST3_FACTOR = 32.0  # distribution 3's scale (make_inputs)
_DIST4_FACTOR = 16.0  # distribution 4's block scale (make_inputs)
# How long the profiled call of trial 0 stays under the profiler after its stop event
# (profiled; trials.py, check_device_time).
_LATE_WORK_NS = 2_000_000


def _sparse_scale(x, seed, i, shift_lo, shift_hi, factor):
    """Multiplies a sparse few of x's elements by `factor` (in place where x is contiguous): one in
    2**k of them, k drawn from (seed, i) in [shift_lo, shift_hi], at least one, at places drawn
    from the seed (distribution 5). Returns x."""
    n = _T_numel(x)
    h = (seed * 2_654_435_761 + 40_503 * i + 97 * shift_lo + 1) % (1 << 61)
    count = _max(1, n >> (shift_lo + h % (shift_hi - shift_lo + 1)))
    if not _T_is_contiguous(x):
        x = _T_contiguous(x)
    flat = _T_view(x, -1)
    gen = _Generator(device=x.device).manual_seed(h // 7)
    at = _torch_randint(0, n, (count,), generator=gen, device=x.device)
    _T_index_put_(flat, (at,), _T_mul(_torch_index_select(flat, 0, at), factor))
    return x


def _block_of(seed, i, n):
    """Distribution 4's block of input i (n elements): (start, length), a run of n/4, n/8, n/16,
    n/32 or n/64 elements in row-major order at a place drawn from the seed."""
    h = (seed * 1_000_003 + 7_919 * i + 12_345) % (1 << 61)
    length = _max(1, n // (4 << (h % 5)))
    start = (h // 5) % _max(1, n - length + 1)
    return start, length



class Reference:
    """What the reference phase tells the phases after it (reference_phase), and what the
    candidate's worker is told of it across the trust boundary (executor.py: reference_info, which
    carries every field but task, given_inputs and round_slack, and take_reference_info).

    task            the task's module (None in the candidate's worker, which never has it)
    trials          the correctness trials: the job's, fewer where the device cannot hold their
                    outputs (fit_trials); in the candidate's worker, the inputs it was given
    dists           the input distributions the trials and the timing rounds draw, in turn
                    (make_inputs; 2 and 3 left out where the task says its inputs keep their
                    domain, those where the reference is not finite left out too)
    trial_dists     each trial's input distribution
    init_inputs     get_init_inputs(), as the reference got them (the candidate's worker's come
                    from reference_info)
    aliased         per output of the reference on trial 0: whether it shares memory with an input
    profile         the counts and names of the reference's profiled call (own_work), or None
    kernel_mode     how a candidate's kernels are counted ("device", "launches", "ops"), or None
                    where the reference's profile shows nothing (the check is then off)
    round_slack     {distribution: [per output: rounding_factor times the reference's largest
                    rounding error in that distribution's trials]} ({}: fixed tolerances only)
    input_template  trial 0's inputs as descriptions (_encode_inputs): the shape of the timing's
                    buffers across the trust boundary (executor.py, make_buffers)
    given_inputs    the candidate's worker: each trial's inputs, as the evaluator passed them on
    signature       the candidate's worker: Model.__init__'s parameters as data (_param_descs)
    """
    __slots__ = ("task", "trials", "dists", "trial_dists", "init_inputs", "aliased", "profile", "kernel_mode",
                 "round_slack", "input_template", "given_inputs", "signature")

    def __init__(self, trials):
        self.task = None
        self.trials = trials
        self.dists = [0, 1]
        self.trial_dists = []
        self.init_inputs = None
        self.aliased = []
        self.profile = None
        self.kernel_mode = None
        self.round_slack = {}
        self.input_template = None
        self.given_inputs = None
        self.signature = None

    def info(self, signature):
        """The `reference_info` message (executor.py): what the candidate's worker needs of the
        task, as data; `signature`: Model.__init__'s parameters (_param_descs)."""
        return {"type": "reference_info", "init_inputs": _to_wire(_list(self.init_inputs)), "signature": signature,
                "ref_profile": self.profile, "kernel_mode": self.kernel_mode,
                "ref_aliased": [_bool(a) for a in self.aliased], "trial_dists": self.trial_dists,
                "dists": self.dists}

    @staticmethod
    def from_info(info, trials):
        """The candidate's worker's Reference, from the `reference_info` message `info` (its
        `dists` is not taken: that worker draws no inputs); `trials`: the job's, until the
        trials' inputs arrive (executor.py, receive_trial_inputs)."""
        r = Reference(trials)
        r.init_inputs = _list(_from_wire(info.get("init_inputs") or []))
        r.signature = info.get("signature")
        r.profile = info.get("ref_profile")
        r.kernel_mode = info.get("kernel_mode")
        r.aliased = _list(info.get("ref_aliased") or [])
        r.trial_dists = _list(info.get("trial_dists") or [])
        return r


class Baseline:
    """The reference as the timing calls it (prepare_baseline), by the job's `baseline`.

    model      the task's Model, built and on the device
    fn         what a timed call of the reference calls: the model (eager) or its compiled form;
               None for cuda-graph (the timing replays graphs captured on its input buffers:
               executor.py, make_buffers)
    mark_step  compile-reduce-overhead: torch.compiler.cudagraph_mark_step_begin; else None
    """
    __slots__ = ("model", "fn", "mark_step")

    def __init__(self, model=None, fn=None, mark_step=None):
        self.model = model
        self.fn = fn
        self.mark_step = mark_step


def make_inputs(task, device, seed, dist, into=None):
    """get_inputs() of `task` under `seed`, on `device`. Distribution 1 scales every floating
    input elementwise by U(0.5, 2) (signs and domains kept); distribution 2 by U(0.5, 2) with a
    random sign, which a task whose get_inputs() keeps a sign never makes; distribution 3 as 2,
    times 32 (magnitudes the task never makes, where a shortcut that holds only near its own
    scale fails: a softmax without its max subtraction overflows; docs/evaluator.md,
    Correctness). Distribution 4 is 1 with one run of each floating input's elements (a quarter
    to a 64th of them, in row-major order, at a place drawn from the seed) scaled by 16 more:
    values whose weight sits where a sample of the input does not look, so that an output
    estimated from part of the input is off (docs/evaluator.md, Correctness). Distribution 5 (in
    place of 1 where the task allows any domain) is 1 with a sparse few of each input's elements
    (one in 64 to one in 4096, the rate drawn per input) negated and a sparser few (one in 256 to
    one in 16384) times 32: an input whose sample looks like distribution 1's, so that no look at
    part of an input tells a candidate that signs or magnitudes it would have to handle are
    absent.
    Contiguous CUDA tensors go through _HarnessKernels.scale_uniform, others through torch
    operations. Factory calls without a device create their tensors on the worker's device
    directly: generating tens of millions of values on the host and copying them over took
    most of a GPU evaluation's time.

    `into(i, x)`, where given, is where tensor input i (x, as get_inputs() made it) goes: a
    contiguous tensor of x's dtype and size that the caller owns (executor.py's draw: a slot of
    its arena). The input is written there, scaled straight from get_inputs()' tensor, and the
    distributions' later steps work there in place; get_inputs()' own tensor is let go at once.
    Without it a scaled input is a second tensor beside get_inputs()' own: a task of one 16 GiB
    input (KernelBench level1/45) held 32 GiB here while the arena held 16 more, and ran out of
    an H200's memory."""
    _torch_manual_seed(seed)
    with _torch_device(device):
        raw = _list(task.get_inputs())
    out = []
    gen = None
    kernels = _kernels()
    for i in _range(_len(raw)):
        x = raw[i]
        if _isinstance(x, _Tensor):
            x = _T_to(x, device)
            dest = into(i, x) if into is not None else None
            if dest is not None:
                raw[i] = None
            if dist == 0 or not _T_is_floating_point(x):
                if dest is not None:
                    _T_copy_(dest, x)
                    x = dest
            elif kernels is not None and x.device.type == "cuda" and x.dtype in _HarnessKernels._FLOAT \
                    and _T_is_contiguous(x):
                x = kernels.scale_uniform(x, (seed * 7919 + 17 + 1_000_003 * i) % (1 << 64), signed=dist in (2, 3),
                                          out=dest)
            else:
                if gen is None:
                    gen = _Generator(device=device).manual_seed((seed * 7919 + 17) % (1 << 63))
                size = _tuple(_T_size(x))
                f = _T_uniform_(_torch_empty(size, dtype=x.dtype, device=device), 0.5, 2.0, generator=gen)
                if dist in (2, 3):
                    sign = _T_uniform_(_torch_empty(size, dtype=x.dtype, device=device), 0.0, 1.0,
                                       generator=gen)
                    # In x's dtype: a float32 factor would promote a half-precision input.
                    f = _T_mul(f, _T_to(_torch_where(_T_lt(sign, 0.5), -1.0, 1.0), x.dtype))
                x = _T_mul(x, f)
                del f
                if dest is not None:
                    _T_copy_(dest, x)
                    x = dest
            if dist == 3 and _T_is_floating_point(x):
                x = _T_mul_(x, _DIST3_FACTOR) if dest is not None else _T_mul(x, _DIST3_FACTOR)
            if dist == 4 and _T_is_floating_point(x) and _T_numel(x) > 1:
                start, length = _block_of(seed, i, _T_numel(x))
                if _T_is_contiguous(x):  # in place: a task's inputs may fill most of the device
                    run = _T_view(x, -1)[start:start + length]
                    _T_copy_(run, _T_mul(run, _DIST4_FACTOR))
                else:
                    f = _torch_empty(_T_numel(x), dtype=x.dtype, device=x.device)
                    _T_fill_(f, 1.0)
                    _T_fill_(f[start:start + length], _DIST4_FACTOR)
                    x = _T_mul(x, _T_view(f, _tuple(_T_size(x))))
            if dist == 5 and _T_is_floating_point(x) and _T_numel(x) > 1:
                x = _sparse_scale(x, seed, i, 6, 12, -1.0)
                x = _sparse_scale(x, seed, i + 7_777, 8, 14, _DIST3_FACTOR)
        out.append(x)
    return out


def poison_tensor(t, param_storages):
    """Overwrite a reference output's whole storage with 0xFF bytes (NaN for floats), unless it
    is the storage of one of the reference's parameters or buffers (`param_storages`: their
    data pointers), which the reference still needs."""
    if _type(t) is not _Tensor:
        return
    st = _T_untyped_storage(t)
    if _S_data_ptr(st) in param_storages:
        return  # a view of a parameter or buffer: the reference still needs it
    u8 = _torch_empty(0, dtype=_uint8, device=t.device)
    _T_set_(u8, st)
    _T_fill_(u8, 255)


def poison_free_pool(kind):
    """A device with a caching allocator (`kind`, device.py's DeviceKind: CUDA): fill its free
    (reserved but unallocated) blocks with 0xFF, so that a candidate's torch.empty cannot return
    the reference's old values."""
    if not kind.caching_allocator:
        return
    _cuda_synchronize()
    held = []
    small_max = 1 << 20  # requests up to 1 MiB are served from the small pool
    try:
        for _ in _range(6):
            segments = torch.cuda.memory_snapshot()
            progress = False
            for seg in segments:
                if seg.get("device", 0) != 0:
                    continue
                small = seg.get("segment_type") == "small"
                for b in seg.get("blocks", []):
                    if b.get("state") != "inactive":
                        continue
                    size = _int(b.get("size", 0))
                    pieces = []
                    if small:
                        while size > 0:
                            p = _min(size, small_max)
                            pieces.append(p)
                            size -= p
                    elif size > small_max:
                        pieces.append(size)
                    for p in pieces:
                        try:
                            held.append(_torch_empty(p, dtype=_uint8, device="cuda"))
                            progress = True
                        except _BaseException:
                            break
            if not progress:
                break
        for t in held:
            _T_fill_(t, 255)
        _cuda_synchronize()
    except _Done:
        raise
    except _BaseException:
        pass  # best effort; the poisoned reference outputs remain the main defence
    finally:
        del held
        _cuda_synchronize()


def reference_phase(w, job, task_src):
    """The reference phase on worker `w` (its device, channel, laps, exports) for `job`:
    returns (Reference, Baseline)."""
    stage = "in the task's reference"
    r = Reference(job.trials)
    try:
        task = r.task = w.exec_module("crucible_task", task_src, "task.py")
        for n in ("Model", "get_inputs", "get_init_inputs"):
            if not _hasattr(task, n):
                raise _Done("runtime_error", (), f"the task defines no {n}")
        # torch's intra-op thread pool, started here if the reference does not start it, so
        # that no timed call of the reference's starts it.
        torch.ones(1 << 18).sum()
        _torch_manual_seed(job.seed)
        init = _list(task.get_init_inputs())
        r.init_inputs = init
        ref = task.Model(*init)
        ref = ref.to(w.device)
        if job.eval_mode:
            ref.eval()
        ref64 = reference_float64(ref, job.rounding_factor, w.laps)
        param_storages = {
            _S_data_ptr(_T_untyped_storage(p)) for p in _list(ref.parameters()) + _list(ref.buffers())}
        pending = []  # sent once the device is free (see device_done())
        input_bytes = 0
        t0 = w.lap("reference: task and Model", w.t_job)
        # The input distributions (make_inputs): 2 as well, unless the task says that its
        # inputs keep the domain get_inputs() gives them (INPUT_DOMAIN = "as-given"), or the
        # reference's outputs are not finite there while they are on the task's own inputs.
        domain = _getattr(task, "INPUT_DOMAIN", "any")
        if domain not in ("any", "as-given"):
            raise _Done("runtime_error", (),
                        f"the task's INPUT_DOMAIN is {domain!r}; it must be 'any' or 'as-given'")
        r.dists = [0, 5, 2, 3, 4] if domain == "any" else [0, 1, 4]
        r.trial_dists = []
        finite0 = True
        t = 0
        while t < r.trials:  # fit_trials may lower r.trials after the first call
            dist = r.dists[t % _len(r.dists)]
            inputs = make_inputs(task, w.device, job.seed + t, dist)
            t0 = w.lap("reference: inputs", t0)
            out = ref(*inputs)
            w.sync()
            if t == 0:
                ref64, input_bytes = fit_trials(w, r, inputs, out, ref64)
                finite0 = _len(r.dists) > 2 and _all_finite(out)
                r.aliased = _aliased_outputs(out, inputs)
                sample0 = _output_sample(out)
                dtype0 = next((o.dtype for o in _output_items(out)
                               if _type(o) is _Tensor and _T_is_floating_point(o)), None)
            while dist >= 2 and finite0 and not _all_finite(out):
                # The reference is not finite there: that distribution is left out (5 gives way
                # to 1, which keeps the task's signs and scale).
                del out, inputs
                if dist == 5:
                    r.dists[r.dists.index(5)] = 1
                else:
                    r.dists.remove(dist)
                dist = r.dists[t % _len(r.dists)]
                inputs = make_inputs(task, w.device, job.seed + t, dist)
                out = ref(*inputs)
                w.sync()
            r.trial_dists.append(dist)
            t0 = w.lap("reference: calls", t0)
            rounding = None
            if ref64 is not None:
                rounding = rounding_error(ref64, inputs, out, w.sync, w.laps)
                if rounding is None:
                    ref64 = None
                t0 = w.lap("reference: float64 calls", t0)
            frames = []
            descs = _encode(out, frames, w.device, w.exports)
            t0 = w.lap("reference: outputs encoded", t0)
            msg = {"type": "reference", "trial": t, "distribution": dist, "outputs": descs, "trials": r.trials,
                   "input_bytes": input_bytes}
            if t == 0:
                msg["precision"] = w.precision(False)
            if job.role == "reference":
                # The trial's inputs for the candidate's worker (the evaluator passes them on):
                # drawn again from the same seed, as the reference got them, whatever it did
                # to its own. With outputs on a CUDA device only their description goes, with
                # the seed and distribution: the evaluator has this worker draw them again on
                # the device when the candidate's trials need them (executor.py, draw) and
                # copies them across there. As host bytes through the evaluator, the phases that
                # carried three trials of a 6.4 GB input took 68 of a 143 s verdict (KernelBench
                # level1/21_Sigmoid).
                in_frames = []
                again = make_inputs(task, w.device, job.seed + t, dist)
                on_device = w.exports is not None and w.kind.exports
                in_msg = {"type": "inputs", "trial": t,
                          "inputs": _encode_inputs(again, in_frames, (lambda x: {}) if on_device else None)}
                if on_device:
                    in_msg.update(on_device=True, seed=job.seed + t, distribution=dist, digest=_inputs_digest(again))
                pending.append((in_msg, in_frames))
                del again
                if t == 0:
                    r.input_template = pending[-1][0]["inputs"]  # the timing's buffers (make_buffers)
            if rounding is not None:
                msg["rounding"] = rounding
                slack = r.round_slack.setdefault(dist, [])
                if _len(slack) < _len(rounding):
                    slack += [0.0] * (_len(rounding) - _len(slack))
                for i, e in _enumerate(rounding):
                    slack[i] = _max(slack[i], job.rounding_factor * e)
            pending.append((msg, frames))
            for o in _output_items(out):
                poison_tensor(o, param_storages)
            del out, inputs, frames
            t += 1
        if ref64 is None:
            r.round_slack = {}  # the trials' messages may carry it; the rounds use none
            for msg, _ in pending:
                msg.pop("rounding", None)
        del ref64
        # Calibrate kernel counting on the reference (e.g. CUPTI unavailable: no device events).
        inputs = make_inputs(task, w.device, job.seed, 0)
        out, counts = profiled(w, lambda: ref(*inputs))
        r.profile = counts
        # The reference again on trial 0's inputs: a reference that keeps state between
        # calls (a recurrent model updating its hidden state in forward) or draws random
        # numbers of its own gives other outputs, and no candidate can be judged against it
        # (its trials, its determinism and its timed rounds assume one function).
        same, what = _same_sample(sample0, _output_sample(out),
                                  job.tolerances.get(dtype0, (0.0, 0.0)), r.round_slack.get(r.trial_dists[0], []))
        if not same:
            raise _Done("runtime_error", (),
                        "the task's reference is not deterministic: a second call on trial 0's inputs gave "
                        f"other outputs ({what}); it keeps state between calls or draws random numbers "
                        "of its own, and no candidate can be judged against it")
        for o in _output_items(out):
            poison_tensor(o, param_storages)
        del out
        # The reference's work in one call (the verdict's `work`), with the first trial's message.
        work = count_work(ref, inputs, param_storages)
        # The hardware's peaks, where the job asks (the evaluator's first verdict on this
        # hardware, evaluator.limits), with the same message: measured here, before any
        # candidate code exists (env/eval/limits.hpp).
        peaks = None
        if job.peaks:
            t_peaks = _perf_counter_ns()
            peaks = measure_peaks(w.kind, w.device)
            w.lap("reference: peaks", t_peaks)
        for msg, _ in pending:
            if msg.get("type") == "reference":
                if work is not None:
                    msg["work"] = work
                if peaks is not None:
                    msg["peaks"] = peaks
                break
        if w.kind.device_kernels:
            if counts["device"] > 0:
                r.kernel_mode = "device"
            elif counts["launches"] > 0:
                r.kernel_mode = "launches"
            elif counts["ops"] > 0:
                r.kernel_mode = "ops"
        elif counts["ops"] > 0:
            r.kernel_mode = "ops"
        t0 = w.lap("reference: poison and profiled call", t0)
        stage = f"while preparing the {job.baseline} baseline"
        baseline = prepare_baseline(w, job, ref, inputs)
        del inputs
    except _BaseException as e:
        raise _error_done(e, stage) from None
    w.sync()
    t0 = w.lap("reference: baseline", t0)
    if w.exports is None:
        poison_free_pool(w.kind)
        device_done(w, pending)
        w.lap("reference: outputs sent", t0)
        return r, baseline
    # Outputs on the device: the evaluator copies them while it holds the device and says
    # so; the exported copies are then poisoned and freed before any candidate code exists.
    # First the pool's free blocks go back to the driver, poisoned: the float64 calls' and the
    # trials' buffers, which torch keeps cached, left no room for the evaluator's copies of
    # 4 GiB outputs on an 80 GB device (KernelBench level 1: 7, 84, 91-93), alone or not.
    poison_free_pool(w.kind)
    _cuda_empty_cache()
    device_done(w, pending)
    msg = w.chan.recv()
    if msg.get("type") == "stop":
        _os_exit(0)
    if msg.get("type") != "taken":
        raise _Done("runtime_error", (), f"expected taken, got {msg.get('type')!r}")
    t0 = w.lap("reference: evaluator copies outputs", t0)
    # Poisoned now, freed when `run` arrives: the evaluator closes its mappings of them
    # meanwhile, and while they are allocated emptying torch's cache (which the candidate's
    # import could do) cannot return them to the driver.
    for x in w.exports:
        _T_fill_(x, 255)
    poison_free_pool(w.kind)
    w.lap("reference: poison free pool", t0)
    return r, baseline


def count_work(ref, inputs, param_storages):
    """The reference's work in one call on `inputs` (env/verdict.hpp, task_work): its floating-point
    operations by the dtype of each operation's first tensor input, as torch's FLOP counter's
    formulas give them (matrix products, convolutions, attention; elementwise work has no formula
    and is not counted), and the bytes of the inputs' and the outputs' tensors. The call's outputs
    are poisoned as the trials' are. None where the call or a formula fails."""
    if _flop_registry is None:
        return None
    flops = {}

    class _Counting(_TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            formula = _flop_registry.get(func._overloadpacket)
            if formula is not None:
                first = None
                for a in args:
                    if _isinstance(a, _Tensor):
                        first = a
                        break
                name = _SUPPORTED_DTYPES.get(first.dtype, "other") if first is not None else "other"
                flops[name] = flops.get(name, 0) + _int(formula(*args, **kwargs, out_val=result))
            return result

    try:
        with _Counting():
            out = ref(*inputs)
        written = _tensor_bytes(_output_items(out))
        for o in _output_items(out):
            poison_tensor(o, param_storages)
        del out
    except _BaseException:
        return None
    read = _tensor_bytes(_tensors_in(inputs))
    return {"flops": {k: _float(v) for k, v in flops.items()}, "bytes_read": _float(read),
            "bytes_written": _float(written)}


def fastest_ms(fn, kind, reps, warm=2, before=None):
    """The fastest of `reps` timed runs of fn() after `warm` untimed ones: device events on a
    kind with a device clock, the host's clock otherwise; `before()`, where given, runs untimed
    before each (tools/bench/task_bounds.py's cache flush)."""
    for _ in _range(warm):
        fn()
    kind.synchronize()
    best = _float("inf")
    for _ in _range(reps):
        if before is not None:
            before()
            kind.synchronize()
        if kind.device_clock:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            best = _min(best, a.elapsed_time(b))
        else:
            t0 = _perf_counter_ns()
            fn()
            best = _min(best, (_perf_counter_ns() - t0) / 1e6)
    return best


def measure_peaks(kind, device, reps=10):
    """The hardware's peaks (env/eval/limits.hpp, device_peaks), measured by the reference's worker
    of an evaluator's first verdict on that hardware (job.peaks), before any candidate code exists,
    and by tools/bench/task_bounds.py: bytes per ms written (a fill) and copied (the fastest of a
    byte copy, a float32 negation and a ReLU into a second buffer, at 1 and 8 GiB moved on a
    device, 64 MiB on the CPU: one byte copy of 1 GiB measured below the elementwise references'
    own rate on an H200), and FLOPs per ms of square matrix products by dtype (float64, float32,
    TF32 where the kind has a device, float16 there, bfloat16), at two sides each; each the
    fastest of `reps`; and `copy_bytes`, the fewest bytes moved at which the copy rate was
    measured (a call moving fewer may run from caches). A size the device's free memory cannot
    take is passed over. None where nothing could be measured."""
    on_device = kind.device_clock
    try:
        n = (1 << 30) if on_device else (64 << 20)
        buf = _torch_empty(n, dtype=_uint8, device=device)
        peaks = {"write_bytes_per_ms": n / fastest_ms(lambda: buf.fill_(1), kind, reps)}
        del buf
        copy, copy_bytes = 0.0, 0
        for moved in ((1 << 30, 8 << 30) if on_device else (64 << 20,)):
            half = moved // 2
            try:
                src = _torch_empty(half, dtype=_uint8, device=device).random_(0, 128)
                dst = _torch_empty(half, dtype=_uint8, device=device)
            except _BaseException:  # the device's free memory: the smaller size stands
                src = dst = None
                if kind.caching_allocator:
                    _cuda_empty_cache()
                continue
            fs, fd = src.view(torch.float32), dst.view(torch.float32)
            for fn in (lambda: dst.copy_(src), lambda: torch.neg(fs, out=fd), lambda: torch.clamp_min(fs, 0, out=fd)):
                copy = _max(copy, 2 * half / fastest_ms(fn, kind, reps))
            copy_bytes = copy_bytes or moved  # the fewest bytes moved at which it was measured
            src = dst = fs = fd = None
            if kind.caching_allocator:
                _cuda_empty_cache()
        peaks["copy_bytes_per_ms"] = copy
        peaks["copy_bytes"] = copy_bytes  # smaller calls may run from caches (limits.hpp, bound_floor_ms)
        mm = {}
        kinds = [("float64", torch.float64, False), ("float32", torch.float32, False)]
        if on_device:
            kinds += [("tf32", torch.float32, True), ("float16", torch.float16, False)]
        kinds += [("bfloat16", torch.bfloat16, False)]
        matmul = torch.backends.cuda.matmul
        for name, dtype, tf32 in kinds:
            for side in ((4096, 8192) if on_device else (256, 512)):
                s = side // 2 if dtype == torch.float64 else side
                a = torch.randn(s, s, device=device).to(dtype)
                b = torch.randn(s, s, device=device).to(dtype)
                old = matmul.allow_tf32
                matmul.allow_tf32 = tf32
                try:
                    mm[name] = _max(mm.get(name, 0.0), 2.0 * s ** 3 / fastest_ms(lambda: a @ b, kind, reps))
                finally:
                    matmul.allow_tf32 = old
                a = b = None
        peaks["matmul_flops_per_ms"] = mm
        if kind.caching_allocator:
            _cuda_empty_cache()
        return peaks
    except _BaseException:
        return None

def _tensor_bytes(xs):
    """The bytes of the tensors among xs (each counted as its elements, views included)."""
    return _sum(_int(_T_numel(x)) * x.element_size() for x in xs if _type(x) is _Tensor)


def fit_trials(w, r, inputs, out, ref64):
    """CUDA: fewer correctness trials (r.trials) where their outputs would not fit the device.
    Each trial's outputs are held three times over (the reference's kept by the evaluator, its
    export until then, the candidate's), the float64 copy of the reference takes twice the
    inputs and outputs again, and other evaluations share the device: the trials' outputs may
    take half of the device's memory, the float64 calls a quarter. KernelBench's level 1 tasks
    have inputs and outputs of up to 6.4 GB each (19_ReLU: 4096 x 393216 float32), and five
    trials of those asked for more memory than an 80 GB device has. Returns (ref64, or None
    where the float64 calls do not fit (the tolerances then stay fixed); the inputs' bytes, in
    every reference message: the evaluator's retry alone). The evaluator is told the number of
    trials in every reference message and says it in the verdict."""
    in_bytes = _tensor_bytes(_tensors_in(inputs))
    if not w.kind.memory_info:
        return ref64, in_bytes
    try:
        total = torch.cuda.mem_get_info()[1]
    except _BaseException:
        return ref64, in_bytes
    out_bytes = _tensor_bytes(_output_items(out))
    fit = _max(1, _int((total // 2) // _max(3 * out_bytes, 1)))
    if fit < r.trials:
        w.laps["reference: trials the device holds"] = fit
        r.trials = fit
    if ref64 is not None and 2 * (in_bytes + out_bytes) > total // 4:
        w.laps["reference: no float64 copy (its calls would not fit the device)"] = 1
        return None, in_bytes
    return ref64, in_bytes


def reference_float64(ref, rounding_factor, laps):
    """A copy of the reference `ref` in float64 (floating parameters and buffers), whose outputs
    on each trial's inputs say how far the reference's own rounding takes it from the exact
    result (rounding_error); None where rounding_factor is 0 or the copy cannot be made (said in
    `laps`)."""
    if rounding_factor <= 0:
        return None
    try:
        return copy.deepcopy(ref).to(torch.float64)
    except _BaseException as e:
        laps["reference: no float64 copy (" + _exc_line(e)[:120] + ")"] = 1
        return None


def rounding_error(ref64, inputs, out, sync, laps):
    """Per output of the reference's call on `inputs` (`out`): the largest difference, over
    the elements finite in both, between it and the float64 copy's output on the same inputs
    in float64 (0 for outputs that are not floating tensors). None where the float64 call
    fails or gives outputs of another structure (said in `laps`): the tolerances then stay
    fixed. `sync`: the worker's wait for its device."""
    def wide(x):
        if _type(x) is _Tensor and _T_is_floating_point(x):
            return _T_to(x, torch.float64)
        return x

    try:
        with torch.no_grad():
            out64 = ref64(*[_map_tensors(x, wide) for x in inputs])
        a = _output_items(out)
        b = _output_items(out64)
        if _len(a) != _len(b):
            raise ValueError(f"{_len(b)} outputs in float64, {_len(a)} in the reference's dtype")
        errs = []
        for x, y in zip(a, b):
            if _type(x) is not _Tensor or not _T_is_floating_point(x):
                errs.append(0.0)
                continue
            if _type(y) is not _Tensor or _T_size(x) != _T_size(y):
                raise ValueError("an output of another type or shape in float64")
            d = _torch_abs(_T_to(x, torch.float64) - _T_to(y, torch.float64))
            d = torch.where(_torch_isfinite(d), d, torch.zeros_like(d))
            errs.append(_float(d.max()) if _T_numel(d) else 0.0)
        sync()
        return errs
    except _BaseException as e:
        laps["reference: float64 call failed (" + _exc_line(e)[:120] + ")"] = 1
        return None


def device_done(w, pending):
    """Tells the evaluator that a phase's device work is over (worker `w`: the reference's or the
    trials'), then sends the phase's buffered output messages (`pending`: (message, frames)):
    moving and comparing large outputs needs no device, so the evaluator can time another
    candidate meanwhile."""
    w.sync()
    w.chan.send({"type": "device_done"})
    for msg, frames in pending:
        w.chan.send(msg, frames)


def profiled(w, fn):
    """Runs fn() once under torch.profiler (and, for extension calls, sys.setprofile), on worker
    `w` (its device, stream and events). Returns (result, counts) with counts = dict(device,
    launches, ops, ext, busy_ms, window_ms, kernels, operators, kernel_us, operator_us): the
    reference's calibration of kernel counting (reference_phase), the candidate's second call of
    trial 0 (trials.py, call_candidate), and the profiler's first use at start-up (worker.py)."""
    acts = _list(w.kind.profiler_activities)
    modules = _sys_modules
    ext_calls = [0]

    def hook(frame, event, arg):
        # A call into a compiled extension outside every imported package: load_inline's
        # modules and inductor's CPU kernels ("<hash>.kernel") have no top-level package in
        # sys.modules, unlike torch's, numpy's or the builtins' functions.
        if event == "c_call":
            m = _getattr(arg, "__module__", None)
            if _isinstance(m, str) and m.partition(".")[0] not in modules:
                ext_calls[0] += 1

    window_ms = None
    w.sync()  # nothing of the harness's still runs when the profiler starts
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the profiler warns about its event cycles
        with _profile(activities=acts) as prof:
            if w.kind.device_clock:
                _Ev_record(w.ev0, w.stream0)
            _setprofile(hook)
            try:
                out = fn()
            finally:
                _setprofile(None)
            w.sync()
            if w.kind.device_clock:
                _Ev_record(w.ev1, w.stream0)
                _Ev_synchronize(w.ev1)
                window_ms = _Ev_elapsed(w.ev0, w.ev1)
                # The profiler stays on a moment longer: work that a thread of the candidate
                # queues after the synchronisation lands in its record, not in the window.
                t_late = _perf_counter_ns()
                while _perf_counter_ns() - t_late < _LATE_WORK_NS:
                    pass
                w.sync()
    dev = launches = ops = 0
    spans = []
    kernels, operators = {}, {}  # name -> count
    kernel_us, operator_us = {}, {}  # name -> time (us): device time, an operator's own CPU time
    for e in prof.events():
        name = e.name or ""
        if e.device_type == _DeviceType.CUDA:
            dev += 1
            spans.append((e.time_range.start, e.time_range.end))
            kernels[name] = kernels.get(name, 0) + 1
            kernel_us[name] = kernel_us.get(name, 0.0) + (e.time_range.end - e.time_range.start)
        elif "LaunchKernel" in name or "GraphLaunch" in name or "cuLaunch" in name:
            launches += 1
        elif "::" in name:
            ops += 1
            operators[name] = operators.get(name, 0) + 1
            operator_us[name] = operator_us.get(name, 0.0) + e.self_cpu_time_total
    # The device's busy time over all streams (the union of its activities' intervals, us).
    busy_us = 0.0
    end = None
    for a, b in _sorted(spans):
        if end is None or a > end:
            busy_us += b - a
            end = b
        elif b > end:
            busy_us += b - end
            end = b
    return out, {"device": dev, "launches": launches, "ops": ops, "ext": ext_calls[0],
                 "busy_ms": busy_us / 1e3, "window_ms": window_ms, "kernels": kernels, "operators": operators,
                 "kernel_us": kernel_us, "operator_us": operator_us}


def prepare_baseline(w, job, ref, inputs):
    """The reference `ref` as the timing calls it, by job.baseline (a Baseline): eager as it
    is, or compiled with 3 warm-up calls on `inputs`; for cuda-graph the model alone (the timing
    captures it on its own buffers)."""
    if job.baseline == "eager":
        return Baseline(ref, ref)
    if job.baseline in ("compile", "compile-reduce-overhead"):
        mode = "reduce-overhead" if job.baseline == "compile-reduce-overhead" else None
        compiled = torch.compile(ref, mode=mode)
        mark_step = torch.compiler.cudagraph_mark_step_begin if mode else None
        for _ in _range(3):
            if mark_step is not None:
                mark_step()
            out = compiled(*inputs)
            del out
        w.sync()
        return Baseline(ref, compiled, mark_step)
    # cuda-graph: captured by the timing on each sample's input buffers (executor.py, make_buffers).
    return Baseline(ref, None)
