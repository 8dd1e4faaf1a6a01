"""env/eval/harness/outputs.py: what a call of the reference or the candidate leaves behind, as the
phases look at it: its outputs (taken apart, encoded for the evaluator as bytes or device
exports, sampled, compared), its inputs (cloned, placed at random leads, checked unchanged),
and this process's threads (counted before and after)."""
import threading

import torch

from .trusted import (
    _torch_isclose,
    _active_count, _bool, _current_frames, _enumerate, _enumerate_threads, _float,
    _int, _int64, _isinstance, _len, _max, _min, _nd_tobytes, _os_listdir, _OSError, _range, _repr, _S_data_ptr,
    _str, _strided, _T_all, _T_clone, _T_contiguous, _T_copy_, _T_cpu, _T_data_ptr, _T_detach,
    _T_is_contiguous, _T_is_floating_point, _T_item, _T_numel, _T_numpy, _T_reshape, _T_set_, _T_size,
    _T_storage_offset, _T_stride, _T_to, _T_untyped_storage,
    _T_view, _Tensor, _torch_arange, _torch_equal, _torch_index_select, _torch_isfinite,
    _torch_empty, _torch_sum, _tuple, _type, _uint8, _list, _dict
)
from .channel import _Done
from .device import _export, _kernels

_SUPPORTED_DTYPES = {
    torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
    torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
}


# ================================================================================================
# Tensors.

def _byte_view(t):
    """The tensor's contents as a flat uint8 tensor in native order, where the tensor lives."""
    return _T_view(_T_reshape(_T_contiguous(_T_detach(t)), (-1,)), _uint8)


def _raw_bytes(t):
    """Contiguous native-order bytes of a tensor (copied to the CPU)."""
    x = _byte_view(t)
    if x.device.type != "cpu":
        x = _T_cpu(x)
    return _nd_tobytes(_T_numpy(x))


# The digest's chunk (bytes): a multiple of 7, so that every chunk starts at the same place of the
# every-seventh-byte sum. A byte sum widened to int64 in one call copies its bytes as int64 first,
# eight bytes of memory a byte where they lie: 69 GB of device memory for the 8.6 GB input of
# KernelBench's level1/4, which ran the reference's worker out of memory on an H200.
_DIGEST_CHUNK = 7 << 21


def _byte_sums(b):
    """The sum of the flat uint8 tensor b's bytes and of every seventh byte from the fourth,
    computed where b lies, a chunk at a time (_DIGEST_CHUNK), read back once."""
    n = _int(_T_numel(b))
    k = _max(1, (n + _DIGEST_CHUNK - 1) // _DIGEST_CHUNK)
    sums = _torch_empty((2, k), dtype=_int64, device=b.device)
    for i in _range(k):
        c = b[i * _DIGEST_CHUNK:(i + 1) * _DIGEST_CHUNK]
        _torch_sum(c, 0, dtype=_int64, out=sums[0, i])
        _torch_sum(c[3::7], 0, dtype=_int64, out=sums[1, i])
    total = _torch_sum(sums, 1)
    return _int(_T_item(total[0])), _int(_T_item(total[1]))


def _inputs_digest(inputs):
    """A digest of one call's tensors, computed where they lie (each one's size, byte sum and the
    sum of every seventh byte): that a trial's inputs drawn again from its seed are the ones the
    reference got (reference.py, executor.py's draw). Plain values travel as they are."""
    parts = []
    for x in inputs:
        if _type(x) is _Tensor:
            b = _byte_view(x)
            whole, seventh = _byte_sums(b)
            parts.append(f"{_int(_T_numel(b))}:{whole}:{seventh}")
    return ";".join(parts)


def _kind_of(o):
    t = _type(o)
    if _isinstance(o, _Tensor):
        return f"tensor subclass {t.__name__}"
    if o is None:
        return "None"
    return t.__name__


def _output_items(out):
    """The list of outputs a forward returned: a plain tensor, or a tuple/list of them."""
    t = _type(out)
    if t is tuple or t is list or (_isinstance(out, tuple) and t.__module__ == "torch.return_types"):
        return [out[i] for i in _range(_len(out))]
    return [out]


def _tensors_in(inputs):
    """The plain tensors among `inputs` (nested lists and tuples too), in order."""
    found = []

    def add(t):
        if _type(t) is _Tensor:
            found.append(t)
        return t

    for x in inputs:
        _map_tensors(x, add)
    return found


def _input_storages(inputs):
    """Data pointers of the storages of the tensors among `inputs`."""
    ptrs = {_S_data_ptr(_T_untyped_storage(t)) for t in _tensors_in(inputs)}
    ptrs.discard(0)
    return ptrs


def _aliased_outputs(out, inputs):
    """For each output (see _output_items), whether it is a tensor that shares memory with one
    of the inputs: the input itself, a view of it, or the input changed in place."""
    ptrs = _input_storages(inputs)
    return [_type(o) is _Tensor and _S_data_ptr(_T_untyped_storage(o)) in ptrs for o in _output_items(out)]


def _output_sample(out):
    """Up to 4096 elements of each tensor output at evenly spaced positions, in float64 on the host
    (None for an output that is not a tensor): what _same_sample compares."""
    got = []
    for o in _output_items(out):
        if _type(o) is not _Tensor or _T_numel(o) == 0:
            got.append(None)
            continue
        flat = _T_reshape(o, (-1,))
        n = _T_numel(flat)
        k = _min(n, 4096)
        # Integer positions (a float linspace rounds past the end of tens of millions).
        idx = _torch_arange(k, dtype=_int64, device=flat.device) * (n - 1) // _max(k - 1, 1)
        got.append(_T_to(_T_to(_torch_index_select(flat, 0, idx), torch.float64), "cpu"))
    return got


def _same_sample(a, b, tolerances, slack):
    """Whether two _output_sample()s agree, floating elements within (atol + slack + rtol*|a|) of
    their dtype's tolerances (NaN where the other has NaN), others exactly. Returns (True, "") or
    (False, what differs)."""
    if _len(a) != _len(b):
        return False, f"{_len(a)} outputs, then {_len(b)}"
    for i, (x, y) in _enumerate(zip(a, b)):
        if x is None or y is None:
            continue
        if _T_size(x) != _T_size(y):
            return False, f"output {i}: another size"
        atol, rtol = tolerances
        s = slack[i] if i < _len(slack) else 0.0
        # isclose: an infinity equals only itself (a bound of atol + rtol*|inf| would pass anything).
        bad = ~_torch_isclose(y, x, rtol=rtol, atol=atol + s, equal_nan=True)
        n = _int(_T_item(bad.sum()))
        if n:
            j = _int(_T_item(bad.nonzero()[0][0]))
            return False, (f"output {i}: {n} of {_T_numel(x)} sampled elements differ "
                           f"(first: {_float(x[j]):.6g}, then {_float(y[j]):.6g})")
    return True, ""


def _all_finite(out):
    """Whether no floating output holds NaN or an infinity (waits for the device)."""
    for o in _output_items(out):
        if _type(o) is _Tensor and _T_is_floating_point(o) and _T_numel(o) > 0 \
                and not _T_item(_T_all(_torch_isfinite(o))):
            return False
    return True


def _encode(out, frames, device, exports=None):
    """Descriptions of a forward's outputs. Plain tensors travel as raw bytes in `frames`, or,
    when `exports` is a list, stay on the device: a fresh copy of each is appended to `exports`
    (the caller keeps it alive until the evaluator has read it) and described by its IPC handle."""
    descs = []
    for o in _output_items(out):
        if _type(o) is not _Tensor:
            descs.append({"kind": _kind_of(o)})
        elif o.device.type != device:
            descs.append({"kind": f"tensor on {o.device.type}, expected {device}"})
        elif o.layout != _strided:
            descs.append({"kind": f"tensor with layout {o.layout}"})
        elif o.dtype not in _SUPPORTED_DTYPES:
            descs.append({"kind": f"tensor of unsupported dtype {_str(o.dtype).replace('torch.', '')}"})
        else:
            desc = {"dtype": _SUPPORTED_DTYPES[o.dtype], "shape": [_int(d) for d in _T_size(o)]}
            shared = None
            if exports is not None:
                x = _T_clone(_byte_view(o))
                shared = _export(x)
                if shared is not None:
                    exports.append(x)
                    desc.update(shared)
                del x
            if shared is None:
                frames.append(_raw_bytes(o))
                desc["frame"] = _len(frames)
            descs.append(desc)
    return descs


# ================================================================================================
# Inputs across the trust boundary (executor.py): the reference worker's, for the candidate's.

_DTYPES = {name: dt for dt, name in _SUPPORTED_DTYPES.items()}
# Values that cross the boundary as JSON (inputs that are not tensors, get_init_inputs()).
_PLAIN = (int, float, bool, str, type(None))


def _plain(v):
    """Whether `v` travels as JSON: numbers, strings, None, and lists or tuples of those."""
    if _type(v) in _PLAIN:
        return True
    if _type(v) in (list, tuple):
        return all(_plain(x) for x in v)
    return False


def _to_wire(v):
    """A plain value as JSON that keeps its tuples: a tuple becomes {"tuple": [...]} (JSON has
    lists only, and a constructor that takes stride=(2, 3) may use tuple arithmetic on it)."""
    t = _type(v)
    if t is _tuple:
        return {"tuple": [_to_wire(x) for x in v]}
    if t is _list:
        return [_to_wire(x) for x in v]
    return v


def _from_wire(v):
    """The inverse of _to_wire."""
    t = _type(v)
    if t is _dict and _len(v) == 1 and "tuple" in v and _type(v["tuple"]) is _list:
        return _tuple(_from_wire(x) for x in v["tuple"])
    if t is _list:
        return [_from_wire(x) for x in v]
    return v


def _encode_inputs(inputs, frames, place=None):
    """Descriptions of one call's inputs for the other side of the boundary: a tensor as
    {"dtype", "shape", "frame"} (contiguous native bytes in `frames`), or with `place` as
    {"dtype", "shape"} and what place(tensor) returns (where it put the tensor on the device);
    any other value as {"value": JSON}. A value that neither describes is a task the boundary
    cannot carry."""
    descs = []
    for i, x in _enumerate(inputs):
        if _type(x) is _Tensor:
            if x.dtype not in _SUPPORTED_DTYPES:
                raise _Done("runtime_error", (), f"input {i} of the task is a tensor of dtype {x.dtype}, which the "
                                                 "evaluator cannot carry to the candidate's process")
            d_ = {"dtype": _SUPPORTED_DTYPES[x.dtype], "shape": [_int(d) for d in _T_size(x)]}
            if place is None:
                frames.append(_raw_bytes(x))
                d_["frame"] = _len(frames)
            else:
                d_.update(place(x))
            descs.append(d_)
        elif _plain(x):
            descs.append({"value": _to_wire(x)})
        else:
            raise _Done("runtime_error", (), f"input {i} of the task is {_kind_of(x)}, which the evaluator cannot "
                                             "carry to the candidate's process (tensors and plain values only)")
    return descs


def _described_tensor(d):
    """The dtype and shape of a tensor input the evaluator describes ({"dtype", "shape", ...})."""
    dt = _DTYPES.get(d.get("dtype"))
    if dt is None:
        raise _Done("runtime_error", (), f"the evaluator sent an input of unknown dtype {d.get('dtype')!r}")
    return dt, [_int(s) for s in d["shape"]]


def _decode_inputs(descs, frames, device):
    """The inverse of _encode_inputs: fresh, writable tensors on `device`."""
    out = []
    for d in descs:
        if "value" in d:
            out.append(_from_wire(d["value"]))
            continue
        dt, shape = _described_tensor(d)
        raw = frames[_int(d["frame"]) - 1]
        t = torch.frombuffer(bytearray(raw), dtype=dt) if _len(raw) else _torch_empty(0, dtype=dt)
        out.append(t.reshape(shape).to(device))
    return out


def _map_tensors(x, fn):
    if _isinstance(x, _Tensor):
        return fn(x)
    if _type(x) in (list, tuple):
        return _type(x)(_map_tensors(v, fn) for v in x)
    return x


def _clone_inputs(inputs):
    return [_map_tensors(x, lambda t: _T_clone(t)) for x in inputs]


def _placed(inputs, jitter, rand):
    """A copy of `inputs` whose contiguous tensors each start 0 to `jitter` bytes (in 512-byte
    steps, drawn with `rand`, the harness's generator: Worker.rng_random) into a fresh allocation
    of their size plus that lead; other tensors are cloned. The caching allocator hands back
    blocks of the sizes a round frees, so new allocations alone land at the same few addresses
    round after round (4 over 33 rounds on an H100); the random lead moves every round's inputs.
    The trials' inputs (trials.py, with the job's jitter_bytes) are placed as the timing rounds'
    buffers are (executor.py, make_buffers)."""
    if jitter < 512:
        return _clone_inputs(inputs)
    steps = jitter // 512

    def place(t):
        if _type(t) is not _Tensor or t.requires_grad or not _T_is_contiguous(t):
            return _T_clone(t)
        lead = _int(rand() * (steps + 1)) * 512
        size = _int(_T_numel(t)) * t.element_size()
        buf = _torch_empty(lead + size, dtype=_uint8, device=t.device)
        y = _torch_empty(0, dtype=t.dtype, device=t.device)
        _T_set_(y, _T_untyped_storage(buf), lead // t.element_size(), _T_size(t), _T_stride(t))
        _T_copy_(y, t)
        return y

    return [_map_tensors(x, place) for x in inputs]


def _same_bytes(a, b):
    """Bytewise equality of two tensors of the same dtype, shape and device (NaN equals NaN),
    computed where they live."""
    kernels = _kernels()
    if kernels is not None and a.device.type == "cuda":
        return not kernels.bytes_differ(_byte_view(a), _byte_view(b))
    return _bool(_torch_equal(_byte_view(a), _byte_view(b)))


def _input_layout(inputs):
    """Where each input tensor lies: (data pointer, storage offset, size, stride) in order. A
    clone starts at offset 0, so the trials compare this before and after a call besides
    _same_input's bytes (their inputs lie at offsets into larger allocations, as timed ones do)."""
    return [(_T_data_ptr(t), _T_storage_offset(t), _tuple(_T_size(t)), _T_stride(t)) for t in _tensors_in(inputs)]


def _inputs_unchanged(inputs, layout, pristine):
    """Whether a call left `inputs` where they lay (_input_layout before it) and as they were
    (their pristine clones)."""
    return _input_layout(inputs) == layout and all(_same_input(a, b) for a, b in zip(inputs, pristine))


def _same_input(a, b):
    """True when input `a` (after the call) equals its pristine clone `b`, bytewise (its place in
    memory is _input_layout's)."""
    if _isinstance(b, _Tensor):
        if _type(a) is not _type(b):
            return False
        if a.dtype != b.dtype or a.device != b.device or _tuple(_T_size(a)) != _tuple(_T_size(b)) \
                or _T_stride(a) != _T_stride(b):
            return False
        return _same_bytes(a, b)
    if _type(b) in (list, tuple):
        return _type(a) is _type(b) and _len(a) == _len(b) and all(_same_input(x, y) for x, y in zip(a, b))
    try:
        return _bool(a == b)
    except Exception:
        return _repr(a) == _repr(b)


# ================================================================================================
# Threads.

def _os_threads():
    try:
        return _len(_os_listdir("/proc/self/task"))
    except _OSError:
        return -1


def _py_threads():
    return _active_count(), _len(_current_frames())


def _thread_names():
    try:
        return ", ".join(sorted(t.name for t in _enumerate_threads() if t is not threading.main_thread()))
    except Exception:
        return "?"
