"""outputs.py: inputs encoded for the other side of the trust boundary and decoded there
(_encode_inputs, _decode_inputs, _plain), outputs taken apart and described (_output_items,
_encode), and the checks on a call's outputs and inputs (aliasing, bytes written, inputs
unchanged)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

# Every dtype the evaluator carries, by the name the protocol gives it.
DTYPES = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool,
}


def sample(dtype, shape=(2, 3)):
    """Distinct, exactly representable values of `dtype` (negative ones where it has them)."""
    n = 1
    for d in shape:
        n *= d
    v = torch.arange(n, dtype=torch.float64) - (n // 2 if dtype not in (torch.uint8, torch.bool) else 0)
    if dtype == torch.bool:
        v = torch.remainder(v, 2)
    elif dtype.is_floating_point:
        v = v * 0.5  # halves: exact in every float dtype
    return v.to(dtype).reshape(shape)


def round_trip(outputs, inputs):
    frames = []
    descs = outputs._encode_inputs(inputs, frames)
    # What crosses the boundary: JSON descriptions and raw byte frames.
    descs = json.loads(json.dumps(descs))
    return descs, frames, outputs._decode_inputs(descs, [bytes(f) for f in frames], "cpu")


def test_the_supported_dtypes(outputs):
    assert outputs._SUPPORTED_DTYPES == {dt: name for name, dt in DTYPES.items()}


@pytest.mark.parametrize("name", DTYPES)
def test_each_dtype_round_trips(outputs, name):
    x = sample(DTYPES[name])
    descs, frames, (y,) = round_trip(outputs, [x])
    assert descs == [{"dtype": name, "shape": [2, 3], "frame": 1}]
    assert len(frames) == 1 and len(frames[0]) == 6 * x.element_size()
    assert y.dtype == x.dtype and y.shape == x.shape and y.is_contiguous()
    assert torch.equal(y, x)


def test_the_frame_holds_native_bytes_in_row_major_order(outputs):
    x = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.float32)
    frames = []
    outputs._encode_inputs([x], frames)
    assert frames[0] == np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32).tobytes()
    b = torch.tensor([1.0, -2.0], dtype=torch.bfloat16)  # bfloat16: the top half of float32's bits
    frames = []
    outputs._encode_inputs([b], frames)
    assert frames[0] == np.array([0x3F80, 0xC000], dtype=np.uint16).tobytes()


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (2, 1, 3, 1)])
def test_shapes_round_trip(outputs, shape):
    x = sample(torch.float32, shape)
    descs, frames, (y,) = round_trip(outputs, [x])
    assert descs[0]["shape"] == list(shape)
    assert len(frames[0]) == 4 * x.numel()
    assert y.shape == x.shape and torch.equal(y, x)


def test_non_contiguous_tensors_travel_in_logical_order(outputs):
    base = torch.arange(24, dtype=torch.int32).reshape(4, 6)
    t = base.t()                     # strides (1, 6)
    sliced = base[1:, ::2]           # storage offset 6, strides (6, 2)
    expanded = torch.tensor([7, 8], dtype=torch.int64).expand(3, 2)   # stride 0
    descs, frames, (a, b, c) = round_trip(outputs, [t, sliced, expanded])
    assert [d["shape"] for d in descs] == [[6, 4], [3, 3], [3, 2]]
    assert frames[1] == np.array([[6, 8, 10], [12, 14, 16], [18, 20, 22]], dtype=np.int32).tobytes()
    assert torch.equal(a, t) and torch.equal(b, sliced) and torch.equal(c, expanded)
    assert a.is_contiguous() and b.is_contiguous() and c.stride() == (2, 1)


def test_plain_values_travel_as_json_between_numbered_frames(outputs):
    x, y = sample(torch.float32), sample(torch.int64, (4,))
    inputs = [3, x, 2.5, True, "mean", None, y, [1, 2, (3, 4)], (0.5, -1)]
    descs, frames, got = round_trip(outputs, inputs)
    assert descs == [
        {"value": 3}, {"dtype": "float32", "shape": [2, 3], "frame": 1}, {"value": 2.5}, {"value": True},
        {"value": "mean"}, {"value": None}, {"dtype": "int64", "shape": [4], "frame": 2},
        {"value": [1, 2, {"tuple": [3, 4]}]}, {"value": {"tuple": [0.5, -1]}},
    ]
    assert len(frames) == 2
    assert got[0] == 3 and got[2] == 2.5 and got[3] is True and got[4] == "mean" and got[5] is None
    # Tuples arrive as tuples and lists as lists (JSON has lists only: a tuple travels tagged).
    assert got[7] == [1, 2, (3, 4)] and type(got[7]) is list and type(got[7][2]) is tuple
    assert got[8] == (0.5, -1) and type(got[8]) is tuple
    assert torch.equal(got[1], x) and torch.equal(got[6], y)


def test_wire_values_keep_tuples_and_lists_apart(outputs):
    for v in [(2, 3), [(2, 3), [1, (4,)]], (), [], ((1,), "a", None), [1.5, True]]:
        wire = json.loads(json.dumps(outputs._to_wire(v)))
        assert outputs._from_wire(wire) == v and type(outputs._from_wire(wire)) is type(v)


def test_decoded_tensors_are_fresh_and_writable(outputs):
    frames = []
    descs = outputs._encode_inputs([torch.ones(4)], frames)
    raw = bytes(frames[0])
    (y,) = outputs._decode_inputs(descs, [raw], "cpu")
    y.add_(1.0)  # no warning about a read-only buffer, and the frame is not written through
    assert raw == frames[0] and torch.equal(y, torch.full((4,), 2.0))


def test_plain(outputs):
    for v in (1, 1.5, True, "s", None, [1, "a", None], (1, (2.0, [3]))):
        assert outputs._plain(v), v
    for v in ({"a": 1}, {1, 2}, b"x", torch.ones(1), [1, torch.ones(1)], 1 + 2j, torch.float32, np.float32(1.0)):
        assert not outputs._plain(v), v


def test_inputs_the_boundary_cannot_carry_are_refused_clearly(outputs, channel):
    cases = [
        ([torch.ones(2, dtype=torch.complex64)],
         "input 0 of the task is a tensor of dtype torch.complex64, which the evaluator cannot carry to the "
         "candidate's process"),
        ([1, {"k": 1}],
         "input 1 of the task is dict, which the evaluator cannot carry to the candidate's process (tensors and "
         "plain values only)"),
        ([torch.nn.Parameter(torch.ones(2))],
         "input 0 of the task is tensor subclass Parameter, which the evaluator cannot carry to the candidate's "
         "process (tensors and plain values only)"),
        ([[torch.ones(2)]],
         "input 0 of the task is list, which the evaluator cannot carry to the candidate's process (tensors and "
         "plain values only)"),
    ]
    for inputs, message in cases:
        with pytest.raises(channel._Done) as e:
            outputs._encode_inputs(inputs, [])
        assert e.value.status == "runtime_error"
        assert e.value.checks == []
        assert e.value.message == message


def test_an_unknown_dtype_from_the_evaluator_is_refused(outputs, channel):
    with pytest.raises(channel._Done) as e:
        outputs._decode_inputs([{"dtype": "complex64", "shape": [1], "frame": 1}], [b"\0" * 8], "cpu")
    assert (e.value.status, e.value.message) == (
        "runtime_error", "the evaluator sent an input of unknown dtype 'complex64'")


def test_a_frame_of_the_wrong_size_does_not_decode(outputs):
    with pytest.raises(RuntimeError):
        outputs._decode_inputs([{"dtype": "float32", "shape": [2, 2], "frame": 1}], [b"\0" * 12], "cpu")


# ------------------------------------------------------------------------------------------------
# Outputs.

def test_output_items(outputs):
    a, b = torch.ones(2), torch.zeros(3)
    assert outputs._output_items(a)[0] is a
    assert [o is x for o, x in zip(outputs._output_items((a, b)), (a, b))] == [True, True]
    assert len(outputs._output_items([a, b, None])) == 3
    values, indices = torch.max(torch.tensor([[1.0, 5.0], [3.0, 2.0]]), dim=1)  # torch.return_types.max
    items = outputs._output_items(torch.max(torch.tensor([[1.0, 5.0], [3.0, 2.0]]), dim=1))
    assert len(items) == 2 and torch.equal(items[0], values) and torch.equal(items[1], indices)
    nested = ((a, b),)
    assert outputs._output_items(nested)[0] == (a, b)  # one level only


def test_encode_describes_outputs_it_cannot_compare(outputs):
    x = torch.tensor([1.5, -2.0], dtype=torch.float32)
    frames = []
    descs = outputs._encode((x, None, 2.0, torch.nn.Parameter(torch.ones(1)), torch.ones(2, dtype=torch.complex64),
                             torch.eye(2).to_sparse()), frames, "cpu")
    assert descs == [
        {"dtype": "float32", "shape": [2], "frame": 1},
        {"kind": "None"},
        {"kind": "float"},
        {"kind": "tensor subclass Parameter"},
        {"kind": "tensor of unsupported dtype complex64"},
        {"kind": "tensor with layout torch.sparse_coo"},
    ]
    assert frames == [np.array([1.5, -2.0], dtype=np.float32).tobytes()]
    assert outputs._encode(x, [], "cuda") == [{"kind": "tensor on cpu, expected cuda"}]


def test_aliased_outputs(outputs):
    x, y = torch.ones(4, 4), torch.ones(4)
    assert outputs._aliased_outputs((x[1], x.t(), x.clone(), y.view(2, 2), 3.0), [x, 1, [y]]) == [
        True, True, False, True, False]


def test_inputs_unchanged(outputs):
    x, n = torch.arange(12.0).reshape(3, 4) * 0.25, torch.tensor([float("nan"), 1.0])
    inputs = [x, 2, [n]]
    layout, pristine = outputs._input_layout(inputs), outputs._clone_inputs(inputs)
    assert outputs._inputs_unchanged(inputs, layout, pristine)   # NaN equals NaN bytewise
    x[1, 2] += 1.0
    assert not outputs._inputs_unchanged(inputs, layout, pristine)
    x[1, 2] -= 1.0
    assert outputs._inputs_unchanged(inputs, layout, pristine)
    x.t_()    # metadata changed in place: same bytes, another shape
    assert not outputs._inputs_unchanged(inputs, layout, pristine)
    x.t_()
    assert outputs._inputs_unchanged(inputs, layout, pristine)
    assert not outputs._inputs_unchanged([x, 3, [n]], layout, pristine)   # a plain value differs
    z = torch.zeros(4)
    layout, pristine = outputs._input_layout([z]), outputs._clone_inputs([z])
    z.set_(torch.zeros(8)[4:])   # same values and shape, elsewhere in memory
    assert not outputs._inputs_unchanged([z], layout, pristine)
    assert outputs._same_input(-0.0, 0.0) and not outputs._same_input(torch.tensor([-0.0]), torch.tensor([0.0]))


def test_the_inputs_digest_is_summed_a_chunk_at_a_time(outputs, monkeypatch):
    # The same figures as one widened sum, for sizes below, at and across the chunk (a multiple of
    # 7, so the every-seventh-byte sum keeps its place from chunk to chunk); and no widened copy of
    # the whole input: the extra memory stays near one chunk's eight bytes a byte.
    def naive(x):
        b = x.contiguous().view(-1).view(torch.uint8)
        return f"{b.numel()}:{int(b.sum(dtype=torch.int64))}:{int(b[3::7].sum(dtype=torch.int64))}"

    monkeypatch.setattr(outputs, "_DIGEST_CHUNK", 7 * 5)
    g = torch.Generator().manual_seed(3)
    for n in (1, 4, 34, 35, 36, 70, 71, 1000):
        x = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
        assert outputs._inputs_digest([x]) == naive(x), n
    f = torch.randn(6, 7, generator=g)
    assert outputs._inputs_digest([f, 2, f.t()]) == naive(f) + ";" + naive(f.t())


def test_the_inputs_digest_takes_no_widened_copy_of_an_input():
    # In a fresh interpreter (its peak is this digest's alone): 256 MiB of bytes summed as int64
    # at once would take 2 GiB more; a chunk at a time takes about 134 MiB.
    import subprocess
    import sys
    code = (
        "import resource, sys, torch\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from conftest import load_worker\n"
        "outputs = load_worker()._OWN_MODULES['outputs']\n"
        "torch.set_num_threads(1)\n"
        "big = torch.randint(0, 256, (1 << 28,), dtype=torch.uint8)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "outputs._inputs_digest([big])\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    grown_kib = int(out.stdout.split()[-1])
    assert grown_kib < 512 * 1024, f"the digest of 256 MiB raised the peak by {grown_kib} KiB"
