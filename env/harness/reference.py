"""env/harness/reference.py: the reference phase of a job (Worker.reference_phase, after the
static checks and before any candidate code): the task's Model run on each trial's inputs, drawn
here (make_inputs, for every phase), its outputs sent to the evaluator and then poisoned, the
float64 copy that measures its rounding, and the timing baseline prepared. Worker (worker.py)
takes these methods from _ReferencePhase."""
import copy

import torch

from .trusted import (
    _BaseException, _cuda_empty_cache, _cuda_synchronize, _enumerate, _float, _Generator, _getattr, _hasattr,
    _int, _isinstance, _len, _list, _max, _min, _os_exit, _range, _S_data_ptr, _sum, _T_fill_, _T_is_contiguous,
    _T_copy_, _T_is_floating_point, _T_lt, _T_mul, _T_numel, _T_set_, _T_size, _T_to, _T_uniform_, _T_untyped_storage, _T_view,
    _Tensor, _torch_abs, _torch_device, _torch_empty, _torch_isfinite, _torch_manual_seed, _torch_where, _tuple,
    _type, _uint8
)
from .device import _HarnessKernels, _kernels
from .channel import _Done, _error_done, _exc_line
from .outputs import (
    _aliased_outputs, _encode_inputs, _all_finite, _clone_inputs, _encode, _map_tensors, _output_items, _output_sample,
    _same_sample, _tensors_in
)

_DIST3_FACTOR = 32.0  # distribution 3's scale (make_inputs)
_DIST4_FACTOR = 16.0  # distribution 4's block scale (make_inputs)


def _block_of(seed, i, n):
    """Distribution 4's block of input i (n elements): (start, length), a run of n/4, n/8, n/16,
    n/32 or n/64 elements in row-major order at a place drawn from the seed."""
    h = (seed * 1_000_003 + 7_919 * i + 12_345) % (1 << 61)
    length = _max(1, n // (4 << (h % 5)))
    start = (h // 5) % _max(1, n - length + 1)
    return start, length



class _ReferencePhase:
    """The reference phase's methods of Worker, and the inputs and memory poisoning every phase
    uses."""

    def make_inputs(self, seed, dist):
        """get_inputs() under `seed`. Distribution 1 scales every floating input elementwise by
        U(0.5, 2) (signs and domains kept); distribution 2 by U(0.5, 2) with a random sign, which
        a task whose get_inputs() keeps a sign never makes; distribution 3 as 2, times 32
        (magnitudes the task never makes, where a shortcut that holds only near its own scale
        fails: a softmax without its max subtraction overflows; docs/evaluator.md, Correctness).
        Distribution 4 is 1 with one run of each floating input's elements (a quarter to a 64th
        of them, in row-major order, at a place drawn from the seed) scaled by 16 more: values
        whose weight sits where a sample of the input does not look, so that an output estimated
        from part of the input is off (docs/evaluator.md, Correctness).
        Contiguous CUDA tensors go through _HarnessKernels.scale_uniform, others through torch
        operations. Factory calls without a device create their tensors on the worker's device
        directly: generating tens of millions of values on the host and copying them over took
        most of a GPU evaluation's time."""
        _torch_manual_seed(seed)
        with _torch_device(self.device):
            raw = self.task.get_inputs()
        out = []
        gen = None
        kernels = _kernels()
        for i, x in _enumerate(raw):
            if _isinstance(x, _Tensor):
                x = _T_to(x, self.device)
                if dist == 0 or not _T_is_floating_point(x):
                    pass
                elif kernels is not None and x.device.type == "cuda" and x.dtype in _HarnessKernels._FLOAT \
                        and _T_is_contiguous(x):
                    x = kernels.scale_uniform(x, (seed * 7919 + 17 + 1_000_003 * i) % (1 << 64), signed=dist in (2, 3))
                else:
                    if gen is None:
                        gen = _Generator(device=self.device).manual_seed((seed * 7919 + 17) % (1 << 63))
                    size = _tuple(_T_size(x))
                    f = _T_uniform_(_torch_empty(size, dtype=x.dtype, device=self.device), 0.5, 2.0, generator=gen)
                    if dist in (2, 3):
                        sign = _T_uniform_(_torch_empty(size, dtype=x.dtype, device=self.device), 0.0, 1.0,
                                           generator=gen)
                        # In x's dtype: a float32 factor would promote a half-precision input.
                        f = _T_mul(f, _T_to(_torch_where(_T_lt(sign, 0.5), -1.0, 1.0), x.dtype))
                    x = _T_mul(x, f)
                if dist == 3 and _T_is_floating_point(x):
                    x = _T_mul(x, _DIST3_FACTOR)
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
            out.append(x)
        return out

    def poison_tensor(self, t):
        """Overwrite a reference output's whole storage with 0xFF bytes (NaN for floats)."""
        if _type(t) is not _Tensor:
            return
        st = _T_untyped_storage(t)
        if _S_data_ptr(st) in self.ref_param_storages:
            return  # a view of a parameter or buffer: the reference still needs it
        u8 = _torch_empty(0, dtype=_uint8, device=t.device)
        _T_set_(u8, st)
        _T_fill_(u8, 255)

    def poison_free_pool(self):
        """CUDA: fill the caching allocator's free (reserved but unallocated) blocks with 0xFF,
        so that a candidate's torch.empty cannot return the reference's old values."""
        if not self.cuda:
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

    def reference_phase(self, task_src):
        stage = "in the task's reference"
        try:
            self.task = self.exec_module("crucible_task", task_src, "task.py")
            for n in ("Model", "get_inputs", "get_init_inputs"):
                if not _hasattr(self.task, n):
                    raise _Done("runtime_error", (), f"the task defines no {n}")
            # torch's intra-op thread pool, started here if the reference does not start it,
            # so that its threads are the harness's (Worker.foreign_mark), not the candidate's.
            torch.ones(1 << 18).sum()
            _torch_manual_seed(self.seed)
            init = _list(self.task.get_init_inputs())
            self.init_inputs = init
            ref = self.task.Model(*init)
            ref = ref.to(self.device)
            if self.eval_mode:
                ref.eval()
            self.ref = ref
            ref64 = self.reference_float64(ref)
            self.ref_param_storages = {
                _S_data_ptr(_T_untyped_storage(p)) for p in _list(ref.parameters()) + _list(ref.buffers())}
            pending = []  # sent once the device is free (see device_done())
            t0 = self.lap("reference: task and Model", self.t_job)
            # The input distributions (make_inputs): 2 as well, unless the task says that its
            # inputs keep the domain get_inputs() gives them (INPUT_DOMAIN = "as-given"), or the
            # reference's outputs are not finite there while they are on the task's own inputs.
            domain = _getattr(self.task, "INPUT_DOMAIN", "any")
            if domain not in ("any", "as-given"):
                raise _Done("runtime_error", (),
                            f"the task's INPUT_DOMAIN is {domain!r}; it must be 'any' or 'as-given'")
            self.dists = [0, 1, 2, 3, 4] if domain == "any" else [0, 1, 4]
            self.trial_dists = []
            finite0 = True
            t = 0
            while t < self.trials:  # fit_trials may lower self.trials after the first call
                dist = self.dists[t % _len(self.dists)]
                inputs = self.make_inputs(self.seed + t, dist)
                t0 = self.lap("reference: inputs", t0)
                out = ref(*inputs)
                self.sync()
                if t == 0:
                    ref64 = self.fit_trials(inputs, out, ref64)
                    finite0 = _len(self.dists) > 2 and _all_finite(out)
                    self.ref_aliased = _aliased_outputs(out, inputs)
                    sample0 = _output_sample(out)
                    dtype0 = next((o.dtype for o in _output_items(out)
                                   if _type(o) is _Tensor and _T_is_floating_point(o)), None)
                while dist >= 2 and finite0 and not _all_finite(out):
                    # The reference is not finite there: that distribution is left out.
                    del out, inputs
                    self.dists.remove(dist)
                    dist = self.dists[t % _len(self.dists)]
                    inputs = self.make_inputs(self.seed + t, dist)
                    out = ref(*inputs)
                    self.sync()
                self.trial_dists.append(dist)
                t0 = self.lap("reference: calls", t0)
                rounding = None
                if ref64 is not None:
                    rounding = self.rounding_error(ref64, inputs, out)
                    if rounding is None:
                        ref64 = None
                    t0 = self.lap("reference: float64 calls", t0)
                frames = []
                descs = _encode(out, frames, self.device, self.exports)
                t0 = self.lap("reference: outputs encoded", t0)
                msg = {"type": "reference", "trial": t, "distribution": dist, "outputs": descs, "trials": self.trials,
                       "input_bytes": self.input_bytes}
                if self.role == "reference":
                    # The trial's inputs for the candidate's worker (the evaluator passes them on):
                    # drawn again from the same seed, as the reference got them, whatever it did
                    # to its own.
                    in_frames = []
                    fresh = _encode_inputs(self.make_inputs(self.seed + t, dist), in_frames)
                    pending.append(({"type": "inputs", "trial": t, "inputs": fresh}, in_frames))
                    if t == 0:
                        self.input_template = pending[-1][0]["inputs"]  # the timing's buffers (make_buffers)
                if rounding is not None:
                    msg["rounding"] = rounding
                    slack = self.round_slack.setdefault(dist, [])
                    if _len(slack) < _len(rounding):
                        slack += [0.0] * (_len(rounding) - _len(slack))
                    for i, e in _enumerate(rounding):
                        slack[i] = _max(slack[i], self.rounding_factor * e)
                pending.append((msg, frames))
                for o in _output_items(out):
                    self.poison_tensor(o)
                del out, inputs, frames
                t += 1
            if ref64 is None:
                self.round_slack = {}  # the trials' messages may carry it; the rounds use none
                for msg, _ in pending:
                    msg.pop("rounding", None)
            del ref64
            # Calibrate kernel counting on the reference (e.g. CUPTI unavailable: no device events).
            inputs = self.make_inputs(self.seed, 0)
            out, counts = self.profiled(lambda: ref(*inputs))
            self.ref_profile = counts
            # The reference again on trial 0's inputs: a reference that keeps state between
            # calls (a recurrent model updating its hidden state in forward) or draws random
            # numbers of its own gives other outputs, and no candidate can be judged against it
            # (its trials, its determinism and its timed rounds assume one function).
            same, what = _same_sample(sample0, _output_sample(out),
                                      self.tolerances.get(dtype0, (0.0, 0.0)), self.round_slack.get(self.trial_dists[0], []))
            if not same:
                raise _Done("runtime_error", (),
                            "the task's reference is not deterministic: a second call on trial 0's inputs gave "
                            f"other outputs ({what}); it keeps state between calls or draws random numbers "
                            "of its own, and no candidate can be judged against it")
            for o in _output_items(out):
                self.poison_tensor(o)
            del out
            if self.cuda:
                if counts["device"] > 0:
                    self.kernel_mode = "device"
                elif counts["launches"] > 0:
                    self.kernel_mode = "launches"
                elif counts["ops"] > 0:
                    self.kernel_mode = "ops"
            elif counts["ops"] > 0:
                self.kernel_mode = "ops"
            t0 = self.lap("reference: poison and profiled call", t0)
            stage = f"while preparing the {self.baseline} baseline"
            self.prepare_baseline(inputs)
            del inputs
        except _BaseException as e:
            raise _error_done(e, stage) from None
        self.sync()
        t0 = self.lap("reference: baseline", t0)
        if self.exports is None:
            self.poison_free_pool()
            self.device_done(pending)
            self.lap("reference: outputs sent", t0)
            return
        # Outputs on the device: the evaluator copies them while it holds the device and says
        # so; the exported copies are then poisoned and freed before any candidate code exists.
        # First the pool's free blocks go back to the driver, poisoned: the float64 calls' and the
        # trials' buffers, which torch keeps cached, left no room for the evaluator's copies of
        # 4 GiB outputs on an 80 GB device (KernelBench level 1: 7, 84, 91-93), alone or not.
        self.poison_free_pool()
        _cuda_empty_cache()
        self.device_done(pending)
        msg = self.chan.recv()
        if msg.get("type") == "stop":
            _os_exit(0)
        if msg.get("type") != "taken":
            raise _Done("runtime_error", (), f"expected taken, got {msg.get('type')!r}")
        t0 = self.lap("reference: evaluator copies outputs", t0)
        # Poisoned now, freed when `run` arrives: the evaluator closes its mappings of them
        # meanwhile, and while they are allocated emptying torch's cache (which the candidate's
        # import could do) cannot return them to the driver.
        for x in self.exports:
            _T_fill_(x, 255)
        self.poison_free_pool()
        self.lap("reference: poison free pool", t0)

    def fit_trials(self, inputs, out, ref64):
        """CUDA: fewer correctness trials where their outputs would not fit the device. Each
        trial's outputs are held three times over (the reference's kept by the evaluator, its
        export until then, the candidate's), the float64 copy of the reference takes twice the
        inputs and outputs again, and other evaluations share the device: the trials' outputs may
        take half of the device's memory, the float64 calls a quarter. KernelBench's level 1 tasks
        have inputs and outputs of up to 6.4 GB each (19_ReLU: 4096 x 393216 float32), and five
        trials of those asked for more memory than an 80 GB device has. Returns ref64, or None
        where the float64 calls do not fit (the tolerances then stay fixed). The evaluator is told
        the number in every reference message and says it in the verdict."""
        in_bytes = _sum(_int(_T_numel(x)) * x.element_size() for x in _tensors_in(inputs))
        self.input_bytes = in_bytes  # in every reference message: the evaluator's retry alone
        if not self.cuda:
            return ref64
        try:
            total = torch.cuda.mem_get_info()[1]
        except _BaseException:
            return ref64
        out_bytes = _sum(_int(_T_numel(o)) * o.element_size() for o in _output_items(out) if _type(o) is _Tensor)
        fit = _max(1, _int((total // 2) // _max(3 * out_bytes, 1)))
        if fit < self.trials:
            self.laps["reference: trials the device holds"] = fit
            self.trials = fit
        if ref64 is not None and 2 * (in_bytes + out_bytes) > total // 4:
            self.laps["reference: no float64 copy (its calls would not fit the device)"] = 1
            return None
        return ref64

    def reference_float64(self, ref):
        """A copy of the reference in float64 (floating parameters and buffers), whose outputs
        on each trial's inputs say how far the reference's own rounding takes it from the exact
        result (rounding_error); None where rounding_factor is 0 or the copy cannot be made."""
        if self.rounding_factor <= 0:
            return None
        try:
            return copy.deepcopy(ref).to(torch.float64)
        except _BaseException as e:
            self.laps["reference: no float64 copy (" + _exc_line(e)[:120] + ")"] = 1
            return None

    def rounding_error(self, ref64, inputs, out):
        """Per output of the reference's call on `inputs` (`out`): the largest difference, over
        the elements finite in both, between it and the float64 copy's output on the same inputs
        in float64 (0 for outputs that are not floating tensors). None where the float64 call
        fails or gives outputs of another structure: the tolerances then stay fixed."""
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
            self.sync()
            return errs
        except _BaseException as e:
            self.laps["reference: float64 call failed (" + _exc_line(e)[:120] + ")"] = 1
            return None

    def device_done(self, pending):
        """Tells the evaluator that this phase's device work is over, then sends the phase's
        buffered output messages: moving and comparing large outputs needs no device, so the
        evaluator can time another candidate meanwhile."""
        self.sync()
        self.chan.send({"type": "device_done"})
        for msg, frames in pending:
            self.chan.send(msg, frames)

    def prepare_baseline(self, inputs):
        ref = self.ref
        if self.baseline == "eager":
            self.ref_fn = ref
            return
        if self.baseline in ("compile", "compile-reduce-overhead"):
            mode = "reduce-overhead" if self.baseline == "compile-reduce-overhead" else None
            compiled = torch.compile(ref, mode=mode)
            self.mark_step = torch.compiler.cudagraph_mark_step_begin if mode else None
            for _ in _range(3):
                if self.mark_step is not None:
                    self.mark_step()
                out = compiled(*inputs)
                del out
            self.sync()
            self.ref_fn = compiled
            return
        # cuda-graph: capture the reference on static input buffers.
        static = _clone_inputs(inputs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in _range(3):
                ref(*static)
        torch.cuda.current_stream().wait_stream(side)
        self.sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = ref(*static)
        self.sync()
        self.graph = (graph, static, static_out)
        self.ref_fn = None
