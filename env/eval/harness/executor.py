"""env/eval/harness/executor.py: a worker on one side of the trust boundary (docs/evaluator.md, Trust
boundary). With the job's `role`, a verdict has two workers: the reference worker (role
"reference": the task's Model, never any candidate code) and the candidate worker (role
"candidate": ModelNew, never the task's module). Both answer the same commands (executor_loop):
the evaluator writes each timed sample's inputs into buffers the worker allocated, reads the
clock itself around `go` ... `sampled`, keeps the worker stopped (its control group frozen, or
SIGSTOP where there is none) outside its own calls,
and reads the outputs out of the worker's memory while it is stopped; the comparison and every
number of the verdict are the evaluator's. Nothing this module does in the candidate's process is
trusted: what it reports is data the evaluator checks, and its own checks (after_call) are
defence in depth only. Functions over the phases' data (the Job, Reference, Baseline and
Candidate), on the Worker `w` (worker.py: its device, channel, laps and state checks); the
commands' own state is an ExecutorState."""
import torch

from .trusted import (
    _BaseException, _fresh_seed, _gc_disable, _int, _len, _max, _os_exit, _range, _reseed_visible, _set, _str,
    _T_copy_, _T_contiguous, _T_data_ptr, _T_fill_, _T_is_contiguous, _T_numel, _T_size, _T_stride, _T_view, _Tensor,
    _T_to, _torch_empty, _type, _uint8, _int32, _cuda_empty_cache, _cuda_mem_get_info, _perf_counter_ns
)
from .channel import _Done, _error_done, _need
from .device import _export_range, _stream_wait_value, _stream_write_value
from .outputs import (
    _decode_inputs, _described_tensor, _DTYPES, _encode_inputs, _inputs_digest, _from_wire, _kind_of, _os_threads,
    _output_items, _plain, _py_threads, _SUPPORTED_DTYPES
)
from .reference import Reference, make_inputs
from .trials import _param_descs, after_call

_current_stream = torch.cuda.current_stream


class ExecutorState:
    """The timing commands' state in one worker, across commands (made by executor_loop).

    buf_sets        the input buffers of the next sample: one input list per call (make_buffers)
    sample_outs     (the last sample's outputs, the tensors described to the evaluator): kept
                    alive until it has read them (reply_sample)
    arena           (CUDA) the allocation the input buffers are cut from, kept from round to
                    round (make_buffers)
    draw_arena      (CUDA) the allocation drawn inputs are copied into for the evaluator (draw)
    arena_ex, draw_arena_ex  (CUDA) each arena's CUDA IPC description (_export_range), taken once
                    an arena: every round's buffers and draw are parts of the same two allocations,
                    where an export a buffer cost two driver calls each, every round
    null_out        (CUDA) the output of `launch` with null: 128 bytes of its own, no kernel
    clock_words     (CUDA) this worker's go and done words (setup_clock)
    check_due       (Python threads, OS threads) before the last timed sample, whose checks are
                    made when the next command arrives (reply_sample); None when none is due
    threads_before  (Python threads, OS threads) before the next timed sample (prime)
    placements      the addresses the first input of the samples' first calls had (make_buffers):
                    their count goes to the laps at `finish` ("timing: distinct input addresses")
    graphs          (reference worker, cuda-graph baseline) (graph, outputs) captured on each set of
                    buf_sets (make_buffers)
    """
    __slots__ = ("buf_sets", "sample_outs", "arena", "draw_arena", "arena_ex", "draw_arena_ex", "null_out",
                 "clock_words", "check_due", "threads_before", "placements", "graphs")

    def __init__(self, threads_before):
        self.buf_sets = []
        self.sample_outs = None
        self.arena, self.draw_arena, self.null_out = None, None, None
        self.arena_ex, self.draw_arena_ex = None, None
        self.clock_words = None
        self.check_due = None  # the checks after a timed sample, made with the next command
        self.threads_before = threads_before
        self.placements = _set()
        self.graphs = None


# ------------------------------------------------------------------------------------------------
# The reference worker.

def reference_info(ref):
    """What the candidate's worker needs of the task, as data (Reference.info): its
    constructor's arguments and parameters, what the reference's profiled call ran
    (own_work), and which of its outputs alias an input. Sent after the reference messages."""
    if not _plain(ref.init_inputs):
        raise _Done("runtime_error", (), "get_init_inputs() returns values other than numbers, strings and "
                                         "lists of them, which the evaluator cannot carry to the candidate's "
                                         "process")
    return ref.info(_param_descs(ref.task.Model))


# ------------------------------------------------------------------------------------------------
# The candidate worker.

def take_reference_info(w, job):
    """The candidate worker's Reference (Reference.from_info), from the reference_info
    message the evaluator sends right after the job; returned."""
    info = w.chan.recv()
    if info.get("type") == "stop":
        _os_exit(0)
    if info.get("type") != "reference_info":
        raise _Done("runtime_error", (), f"expected reference_info, got {info.get('type')!r}")
    return Reference.from_info(info, job.trials)


def receive_trial_inputs(w, ref):
    """The candidate worker's trial inputs, drawn by the reference worker: one `inputs`
    message per trial (the reference worker's own, passed on by the evaluator), then `run`.
    They go into its Reference (given_inputs, input_template, trials). On a CUDA device they
    stay where the evaluator copied them while all the trials' together fit in an eighth of the
    device's free memory. Past that, the first trial's go to page-locked host memory (every
    timing round's buffers start with them), and each later trial's are asked for when that
    trial runs (`later` now, `trial_inputs` then: the reference's worker draws them again and the
    evaluator copies them into room made then), so that the device holds one trial's inputs at a
    time and no host memory the others (a task's inputs may be gigabytes: through host memory,
    the copies took 76.5 s of KernelBench level1/45's 87 s of trials on an H200, 8.8 s of
    19_ReLU's). The eighth leaves the rest to what the reference's fit_trials plans for (the
    trials' outputs, three times over, may take half the device): at a quarter, level1/76's
    trials (8.6 GB in, 5.7 GB out) ran out of an H200's memory."""
    ref.given_inputs = []
    ref.input_template = []
    t0 = _perf_counter_ns()
    budget = _cuda_mem_get_info()[0] // 8 if w.kind.memory_info else 0
    kept = 0
    while True:
        msg, frames = w.chan.recv_frames()
        kind = msg.get("type")
        if kind == "stop":
            _os_exit(0)
        if kind == "run":
            break
        if kind != "inputs":
            raise _Done("runtime_error", (), f"expected inputs or run, got {kind!r}")
        if not ref.given_inputs:
            ref.input_template = msg.get("inputs") or []
        if msg.get("on_device") is True:
            descs = msg.get("inputs") or []
            need = _room(descs)[1]
            keep = kept + need <= budget
            kept += need if keep else 0
            if ref.given_inputs and not keep:
                w.chan.send({"type": "later"})
                ref.given_inputs.append(_later_inputs(w, _len(ref.given_inputs)))
                continue
            # Those of the first trial kept in host memory are pinned: every timing round copies
            # them into its buffers.
            ref.given_inputs.append(receive_device_inputs(w, descs, keep, not ref.given_inputs))
        else:
            ref.given_inputs.append(_decode_inputs(msg.get("inputs") or [], frames, "cpu"))
    ref.trials = _len(ref.given_inputs)
    w.lap("trials: inputs received", t0)


def _later_inputs(w, t):
    """Trial t's inputs, asked for when the trial runs (receive_trial_inputs: they did not fit
    the device's budget when the evaluator passed them on): `trial_inputs`, then the evaluator
    passes them on as it did (`inputs`, with room made now), on the device until the trial ends."""
    def fetch():
        w.chan.send({"type": "trial_inputs", "trial": t})
        msg = w.chan.recv()
        if msg.get("type") == "stop":
            _os_exit(0)
        if msg.get("type") != "inputs" or msg.get("on_device") is not True:
            raise _Done("runtime_error", (), f"expected trial {t}'s inputs on the device, got {msg.get('type')!r}")
        return receive_device_inputs(w, msg.get("inputs") or [], True)
    return fetch


def _room(descs):
    """One allocation's layout for the tensors `descs` describe, each at a 512-byte step: per
    input (dtype, shape, bytes, offset), None for a plain value; and the bytes in all."""
    shapes = []
    need = 0
    for d in descs:
        if "value" in d:
            shapes.append(None)
            continue
        dt, shape = _described_tensor(d)
        n = _torch_empty(0, dtype=dt).element_size()
        for s_ in shape:
            n *= s_
        shapes.append((dt, shape, n, need))
        need += ((n + 511) // 512) * 512
    return shapes, need


def _in_room(arena, slot, base=0):
    """The tensor in `arena` (uint8) at one of _room's slots (dtype, shape, bytes, offset), the
    layout starting `base` bytes in."""
    dt, shape, n, at = slot
    return _T_view(_T_view(arena[base + at:base + at + n], dt), shape)


def receive_device_inputs(w, descs, keep=False, pinned=False):
    """One trial's inputs on a CUDA device (an `inputs` message with on_device): this worker
    makes room for them in one allocation of its own, exported (`staging`: the allocation's
    handle, each input's offset and size), the evaluator copies them there from the reference
    worker's draw and says `copied`. `keep`: they stay there (views of the allocation);
    otherwise they are kept in host memory like inputs sent as bytes (`pinned`: in page-locked
    memory, which the device copies from at its own rate, where the driver gives it), and the
    allocation freed."""
    if not w.kind.exports:
        raise _Done("runtime_error", (), "the evaluator sent inputs on a device to a worker without one")
    shapes, need = _room(descs)
    arena = _torch_empty(_max(need, 512), dtype=_uint8, device=w.device)
    ex = _export_range(_T_data_ptr(arena), _int(_T_numel(arena)))
    if ex is None:
        raise _Done("runtime_error", (), "the CUDA driver cannot export the room for a trial's inputs")
    places = [{"value": True} if sh is None else {"offset": ex["offset"] + sh[3], "bytes": sh[2]} for sh in shapes]
    w.sync()
    w.chan.send({"type": "staging", "ipc": ex["ipc"], "inputs": places})
    reply = w.chan.recv()
    if reply.get("type") == "stop":
        _os_exit(0)
    if reply.get("type") != "copied":
        raise _Done("runtime_error", (), f"expected copied, got {reply.get('type')!r}")
    t0 = _perf_counter_ns()
    out = []
    for d, sh in zip(descs, shapes):
        if sh is None:
            out.append(_from_wire(d["value"]))
            continue
        x = _in_room(arena, sh)
        if keep:
            out.append(x)
            continue
        host = None
        if pinned:
            try:
                host = _T_copy_(_torch_empty(_T_size(x), dtype=x.dtype, pin_memory=True), x)
            except _BaseException:
                host = None  # no page-locked memory to be had: pageable, as the other trials'
        out.append(_T_to(x, "cpu") if host is None else host)
    del arena
    if not keep:
        w.sync()
        w.lap("trials: inputs to host memory", t0)
    return out


# ------------------------------------------------------------------------------------------------
# Both: the timing commands.

def _replay(graph, out):
    """A cuda-graph baseline's timed call: the graph replayed, its outputs its own."""
    graph.replay()
    return out


def _stepped(step, fn, inputs):
    """A compile-reduce-overhead baseline's timed call: a new step of its graphs first (their
    outputs are overwritten at the next one)."""
    step()
    return fn(*inputs)


def executor_call(job, baseline, cand, state, i):
    """Timed call i of a sample, on set i of buf_sets, as (fn, args): the candidate's model, or
    the reference as the timing calls it (job.baseline): eager or compiled as it is, called
    directly (no frame of the harness's between a call and its model); compile-reduce-overhead
    through _stepped; cuda-graph the replay of the graph captured on set i's buffers
    (make_buffers). The graph baselines take one call a sample (the evaluator, boundary.cpp)."""
    inputs = state.buf_sets[i]
    if job.role != "reference":
        return cand.model, inputs
    if job.baseline == "cuda-graph":
        return _replay, state.graphs[i]
    if baseline.mark_step is not None:
        return _stepped, (baseline.mark_step, baseline.fn, inputs)
    return baseline.fn, inputs


def capture_graph(w, model, inputs):
    """The reference captured in a CUDA graph on `inputs` (one set of a sample's input buffers), after
    one call on a side stream: (graph, its outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(_current_stream())
    with torch.cuda.stream(side):
        model(*inputs)
    _current_stream().wait_stream(side)
    w.sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(*inputs)
    w.sync()
    return graph, out


def executor_loop(w, job, ref, baseline, cand):
    """Answers the evaluator's timing commands until `finish` or `stop`:
    draw {calls, dist}      (reference worker) fresh inputs for `calls` calls, each from a seed
                            the operating system gives now: `drawn` with their bytes (with
                            on_device, where they lie on the device); with `seed`, one call's
                            from that seed (a trial's inputs again, for the candidate's worker)
    buffers {calls}         input buffers for a sample of `calls` calls: `buffers` with each
                            tensor's address and size (the evaluator writes into them)
    prime                   one untimed call on the buffers as they are: `primed`
    go                      the sample: one call on each set of buffers, back to back, waited
                            for: `sampled` with each output's address, dtype and shape
    null                    `sampled` at once, with no outputs: the clock's own round trip
    clock                   (CUDA) this worker's go and done words: `clock` with their
                            allocation's handle and offset
    launch {seq, null}      (CUDA) the sample queued behind the go word's reaching seq,
                            followed by seq written into the done word, never waited for:
                            `launched` with each output's handle, dtype and shape (null:
                            no calls, 128 bytes of its own described as the output)
    finish / stop           the end of the job
    Between commands the evaluator keeps this process stopped (frozen) while it writes the
    next inputs and while the other side runs. Never returns."""
    state = ExecutorState((_py_threads(), _os_threads()))
    # No cyclic collection inside a timed call (as timeit does): the candidate's worker holds
    # more objects than the reference's, and a collection there would be its time alone.
    _gc_disable()
    w.timing_now = True
    while True:
        msg = w.chan.recv()
        if w.exports:
            w.exports = []  # the trials' outputs: the evaluator has copied or compared them
        kind = msg.get("type")
        if kind == "stop":
            _os_exit(0)
        if state.check_due is not None:
            py0, os0 = state.check_due
            state.check_due = None
            after_call(w, py0, os0, "timing", False)
        if kind == "finish":
            w.laps["timing: distinct input addresses"] = _len(state.placements)
            if job.role == "candidate":
                w.check_full("at the end")
                w.check_state("at the end")
            raise _Done("ok", (), "", w.laps)
        if kind == "draw":
            draw(w, job, ref, state, _int(_need(msg, "calls")), _int(_need(msg, "dist")),
                 msg.get("on_device") is True, None if msg.get("seed") is None else _int(msg["seed"]))
        elif kind == "buffers":
            make_buffers(w, job, ref, baseline, state, _int(_need(msg, "calls")))
        elif kind == "prime":
            prime(w, job, baseline, cand, state)
        elif kind == "go":
            go(w, job, baseline, cand, state)
        elif kind == "clock":
            setup_clock(w, state)
        elif kind == "launch":
            launch(w, job, baseline, cand, state, msg.get("null") is True, _int(_need(msg, "seq")))
        elif kind == "null":  # the round trip alone, for the evaluator's floor
            w.chan.send({"type": "sampled", "outputs": []})
        else:
            raise _Done("runtime_error", (), f"unexpected message {kind!r}")


def describe_outputs(w, outs):
    """Each call's outputs as the evaluator reads them where they lie: dtype, shape, strides,
    address (and on a CUDA device the allocation's handle); (descriptions, tensors to keep)."""
    descs = []
    keep = []
    for out in outs:
        one = []
        for o in _output_items(out):
            if _type(o) is not _Tensor:
                one.append({"kind": _kind_of(o)})
                continue
            if o.device.type != w.device:
                one.append({"kind": f"tensor on {o.device.type}, expected {w.device}"})
                continue
            if o.dtype not in _SUPPORTED_DTYPES:
                one.append({"kind": f"tensor of unsupported dtype {_str(o.dtype).replace('torch.', '')}"})
                continue
            # Where it lies, as it lies (a view with strides too): the evaluator reads it there.
            keep.append(o)
            shape, strides = [_int(s) for s in _T_size(o)], [_int(s) for s in _T_stride(o)]
            d_ = {"dtype": _SUPPORTED_DTYPES[o.dtype], "shape": shape, "strides": strides,
                  "addr": _T_data_ptr(o), "bytes": _int(_T_numel(o)) * o.element_size()}
            if w.kind.exports and d_["bytes"] > 0:
                # On a CUDA device: the allocation's handle, which the evaluator maps.
                last = 0
                for n_, st in zip(shape, strides):
                    last += (n_ - 1) * st
                ex = _export_range(d_["addr"], (last + 1) * o.element_size())
                if ex is None:
                    one.append({"kind": "tensor the CUDA driver cannot export"})
                    continue
                d_["ipc"], d_["offset"] = ex["ipc"], ex["offset"]
            one.append(d_)
        descs.append(one)
    return descs, keep


def _dense(out):
    """A call's outputs, each tensor in row-major layout: made so inside the clock (before the
    sample's synchronisation or its done word), so that a transposed, strided or broadcast
    output pays for its own conversion. The evaluator reads only row-major outputs of the
    candidate's (runtime:output_layout): reading by strides would be its own work on the task."""
    return [_T_contiguous(o) if _type(o) is _Tensor and not _T_is_contiguous(o) else o for o in _output_items(out)]


def reply_sample(w, job, state, outs, reply, check, extra=None):
    """Tells the evaluator where a sample's outputs lie (`reply`: sampled or launched, with the
    fields of `extra`) and keeps them alive until it has read them; then, in the candidate's
    worker and with `check`, the checks after a call."""
    descs, keep = describe_outputs(w, outs)
    state.sample_outs = (outs, keep)
    msg = {"type": reply, "outputs": descs}
    if extra:
        msg.update(extra)
    w.chan.send(msg)
    if job.role == "candidate" and check:
        # Made when the next command arrives, before it is answered: after `sampled` the
        # evaluator stops this process, and on the CPU the sample is charged the CPU time its
        # processes ran until then, which checks run here would add to the candidate's alone.
        state.check_due = state.threads_before


def setup_clock(w, state):
    """CUDA: this worker's two clock words, in its own memory, exported to the evaluator: go
    (at the offset), which this stream waits for before a sample's calls, and done (128 bytes
    on), which it writes after them. Both are the evaluator's to read and write; a worker
    that writes them itself only starts on old inputs or has its outputs copied unfinished."""
    try:
        words = _torch_empty(64, dtype=_int32, device=w.device)
        _T_fill_(words, 0)
        w.sync()
        ex = _export_range(_T_data_ptr(words), 256)
    except _BaseException as e:
        raise _error_done(e, "while setting up the device clock") from None
    if ex is None:
        raise _Done("runtime_error", (), "the CUDA driver cannot export the device clock's words")
    state.clock_words = words
    w.chan.send({"type": "clock", "ipc": ex["ipc"], "offset": ex["offset"]})


def launch(w, job, baseline, cand, state, null, seq):
    """CUDA: one timed sample, queued, never waited for: this stream waits for the go word to
    reach seq (the evaluator writes it after copying the inputs in, its clock started), then
    the calls, then seq into the done word; `launched` with where the outputs will be. The
    evaluator's clock is on the device: it holds its own stream until the calls are queued,
    waits for the done word, copies the outputs and stops (nothing here reads a time or
    waits)."""
    outs = []
    calls = [executor_call(job, baseline, cand, state, i) for i in _range(_len(state.buf_sets))]
    if state.clock_words is None:
        raise _Done("runtime_error", (), "launch before the device clock was set up")
    go = _T_data_ptr(state.clock_words)
    try:
        stream = _current_stream().cuda_stream
        _stream_wait_value(stream, go, seq)
        t0 = _perf_counter_ns()
        if null:  # the window of a sample without calls: done follows go
            t = state.null_out
            if t is None:
                t = state.null_out = _torch_empty(128, dtype=_uint8, device=w.device)
            outs.append(t)
        else:
            for fn, args in calls:
                outs.append(_dense(fn(*args)))
        _stream_write_value(stream, go + 128, seq)
        queued_us = (_perf_counter_ns() - t0) / 1000.0
    except _BaseException as e:
        who = "ModelNew.forward" if job.role == "candidate" else "the reference"
        raise _error_done(e, f"in {who} (timing)") from None
    # How long the host took to queue the calls (outside the device's window, which opens once
    # they are all queued): said for the evaluator's laps, beside the device's time of them (the
    # launch lap also holds the outputs' exports). Data, never a time the verdict uses.
    reply_sample(w, job, state, outs, "launched", not null, {"queued_us": queued_us})


def draw(w, job, ref, state, calls, dist, on_device, seed=None):
    if job.role != "reference":
        raise _Done("runtime_error", (), "only the reference worker draws inputs")
    if seed is not None and calls != 1:
        raise _Done("runtime_error", (), "a draw from a given seed is of one call's inputs")
    frames = []
    sets = []
    msg = {"type": "drawn", "sets": sets}
    try:
        place = into = None
        if on_device and w.kind.exports:
            # On a CUDA device the round's tensors are written into one allocation of this
            # worker's, kept from round to round, which the evaluator maps and copies into its
            # own memory: no bytes cross the socket (a task's inputs may be gigabytes). Each
            # input is drawn straight into its slot (make_inputs' `into`), shaped as the first
            # trial's (input_template, as the timing's buffers are), so that the device holds
            # the arena and get_inputs()' own tensors, not a scaled copy of them as well.
            slots, per_call = _room(ref.input_template)
            need = per_call * calls
            if state.draw_arena is None or _T_numel(state.draw_arena) < need:
                state.draw_arena = state.draw_arena_ex = None
                _cuda_empty_cache()  # what this worker cached goes back to the device first
                state.draw_arena = _torch_empty(_max(need, 512), dtype=_uint8, device=w.device)
            arena = state.draw_arena
            if state.draw_arena_ex is None:
                state.draw_arena_ex = _export_range(_T_data_ptr(arena), _int(_T_numel(arena)))
                if state.draw_arena_ex is None:
                    raise _Done("runtime_error", (), "the CUDA driver cannot export the drawn inputs")
            ex = state.draw_arena_ex
            msg["ipc"] = ex["ipc"]
            base = _T_data_ptr(arena)
            call = [0]

            def into(i, x):
                slot = slots[i] if i < _len(slots) else None
                if slot is None or x.dtype != slot[0] or [_int(s_) for s_ in _T_size(x)] != slot[1]:
                    raise _Done("runtime_error", (),
                                f"the task's get_inputs() gave input {i} of another kind, shape or dtype than on its "
                                "first trial; every call's inputs must be alike")
                return _in_room(arena, slot, call[0] * per_call)

            def place(x):
                return {"offset": ex["offset"] + (_T_data_ptr(x) - base), "bytes": _int(_T_numel(x)) * x.element_size()}
        drawn = []
        for c in _range(calls):
            if into is not None:
                call[0] = c
            drawn.append(make_inputs(ref.task, w.device, _fresh_seed() if seed is None else seed, dist, into))
        if seed is not None:
            msg["digest"] = _inputs_digest(drawn[0])
        for inputs in drawn:
            sets.append(_encode_inputs(inputs, frames, place))
        del drawn
        w.sync()
    except _BaseException as e:
        raise _error_done(e, "while drawing a timing round's inputs") from None
    w.chan.send(msg, frames)


def make_buffers(w, job, ref, baseline, state, calls):
    """`calls` sets of input buffers shaped as the trials' inputs (input_template), contiguous,
    on the worker's device, each at a random lead of up to placement_jitter_bytes / calls
    into an allocation of its own (a kernel's speed can depend on where its buffers lie: the
    evaluator asks for new ones every round, so a verdict averages over placements, as the
    trials' inputs are placed: outputs.py, _placed); plain values as they were. On the CPU each buffer
    starts with what the last buffers held (the first time: the first trial's inputs), on a
    CUDA device with the first trial's inputs (the reference's worker: the inputs it drew last,
    which its draw arena still holds), so that the untimed call before a sample runs on real
    inputs (a task's may be indices that garbage would not be)."""
    t0 = _perf_counter_ns()
    state.sample_outs = None
    old = state.buf_sets
    state.buf_sets = []
    descs = []
    if job.role == "candidate":
        first = ref.given_inputs[0]
    elif w.kind.exports and state.draw_arena is not None:
        # The last draw's first call, where it lies (draw): no inputs made again every round.
        slots, _ = _room(ref.input_template)
        first = [_from_wire(d["value"]) if sl is None else _in_room(state.draw_arena, sl)
                 for d, sl in zip(ref.input_template, slots)]
    else:
        first = make_inputs(ref.task, w.device, job.seed, ref.trial_dists[0])
        t0 = w.lap("timing: the buffers' first inputs", t0)
    steps = (job.jitter_bytes // _max(calls, 1)) // 512
    arena = None
    if w.kind.exports:
        # On a CUDA device the buffers are cut from one arena, kept from round to round (grown
        # when a sample takes more calls): the evaluator maps it once, where an allocation per
        # buffer and round would cost it a mapping each, and the device holds one round's
        # inputs per worker, not two. The old buffers lie in the same memory, so the new ones
        # start with the first trial's inputs.
        old = []
        need = 0
        for d in ref.input_template:
            if "value" not in d:
                n = _torch_empty(0, dtype=_DTYPES[d["dtype"]]).element_size()
                for s_ in d["shape"]:
                    n *= _int(s_)
                need += ((n + 511) // 512 + steps) * 512
        need *= calls
        if state.arena is None or _T_numel(state.arena) < need:
            state.arena = state.arena_ex = None  # the old one is freed before the new one is made
            if w.kind.caching_allocator:
                # Given back to the device first, with what the trials left cached here: the
                # timing's memory (both workers' buffers and outputs, the evaluator's copies of
                # them) is several times a task's inputs and outputs, and the trials' cached
                # blocks of a task of gigabytes left no room for them (KernelBench level 1's
                # 38_L1Norm_, 8.6 GB in and out: out of memory at the first timed sample's copy
                # out on a 141 GB H200).
                _cuda_empty_cache()
            state.arena = _torch_empty(_max(need, 512), dtype=_uint8, device=w.device)
        arena = state.arena
        if state.arena_ex is None:
            state.arena_ex = _export_range(_T_data_ptr(arena), _int(_T_numel(arena)))
            if state.arena_ex is None:
                raise _Done("runtime_error", (), "the CUDA driver cannot export an input buffer of the timing")
    pos = 0
    for c in _range(calls):
        prev = old[c] if c < _len(old) else first
        one, desc = [], []
        first_tensor = c == 0
        for d, x0 in zip(ref.input_template, prev):
            if "value" in d:
                one.append(_from_wire(d["value"]))
                desc.append({"value": True})
                continue
            dt = _DTYPES[d["dtype"]]
            shape = [_int(s) for s in d["shape"]]
            n = 1
            for s_ in shape:
                n *= s_
            size = _torch_empty(0, dtype=dt).element_size()
            lead = (_int(w.rng_random() * (steps + 1)) * 512) // size if steps > 0 else 0
            if arena is not None:
                at = pos + lead * size
                pos += ((n * size + 511) // 512 + steps) * 512
                t = _T_view(_T_view(arena[at:at + n * size], dt), shape)
            else:
                t = _torch_empty(lead + n, dtype=dt, device=w.device)[lead:].view(shape)
            _T_copy_(t, x0)
            if first_tensor:
                state.placements.add(_T_data_ptr(t))
                first_tensor = False
            one.append(t)
            d_ = {"addr": _T_data_ptr(t), "bytes": n * size}
            if w.kind.exports and n > 0:
                # On a CUDA device the evaluator maps the allocation (the arena's) and writes there.
                ex = state.arena_ex
                d_["ipc"], d_["offset"] = ex["ipc"], ex["offset"] + (_T_data_ptr(t) - _T_data_ptr(arena))
            desc.append(d_)
        state.buf_sets.append(one)
        descs.append(desc)
    del old
    w.sync()
    if job.role == "reference" and job.baseline == "cuda-graph":
        # One graph a set of buffers, captured on them, which the timed calls replay (executor_call);
        # the old sets' graphs and their memory go first.
        state.graphs = None
        state.graphs = [capture_graph(w, baseline.model, one) for one in state.buf_sets]
    w.lap("timing: the buffers filled and exported", t0)
    w.chan.send({"type": "buffers", "sets": descs})


def call_once(w, job, baseline, cand, state, i):
    if job.role == "candidate":
        _reseed_visible()
        w.candidate_flags()
    fn, args = executor_call(job, baseline, cand, state, i)
    return fn(*args)


def prime(w, job, baseline, cand, state):
    """The untimed call that precedes each timed sample (on the buffers as the last sample
    left them), waited for (outside the clock)."""
    state.sample_outs = None
    py0, os0 = _py_threads(), _os_threads()
    try:
        if state.buf_sets:
            out = call_once(w, job, baseline, cand, state, 0)
            del out
        w.sync()
    except _BaseException as e:
        who = "ModelNew.forward" if job.role == "candidate" else "the reference"
        raise _error_done(e, f"in {who} (timing, untimed call)") from None
    if job.role == "candidate":
        after_call(w, py0, os0, "timing, untimed call", False)
        # Done here, not in `go`: nothing but the calls is inside the evaluator's clock.
        _reseed_visible()
        w.candidate_flags()
    # The cache flush is the evaluator's, after it has written the sample's inputs.
    w.sync()
    state.threads_before = (_py_threads(), _os_threads())
    w.chan.send({"type": "primed"})


def go(w, job, baseline, cand, state):
    """One timed sample. The clock is the evaluator's: it starts before `go` is sent and stops
    when `sampled` arrives; nothing here reads a time."""
    outs = []
    calls = [executor_call(job, baseline, cand, state, i) for i in _range(_len(state.buf_sets))]
    try:
        for fn, args in calls:
            outs.append(_dense(fn(*args)))
        w.sync()
    except _BaseException as e:
        who = "ModelNew.forward" if job.role == "candidate" else "the reference"
        raise _error_done(e, f"in {who} (timing)") from None
    reply_sample(w, job, state, outs, "sampled", True)
