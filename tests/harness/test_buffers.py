"""executor.py's make_buffers on a device whose memory is exported to the evaluator (CUDA): the
buffers are cut from one arena, described by the arena's CUDA IPC handle and their offsets in it,
and the arena is exported once, not once a buffer and round; a larger arena is exported again.
The driver's export (_export_range) is replaced here by a recorder: this machine has no CUDA
device, so the arena lies in host memory."""
import types

import torch


class FakeChannel:
    def __init__(self):
        self.sent = []

    def send(self, msg):
        self.sent.append(msg)


def worker():
    kind = types.SimpleNamespace(exports=True, caching_allocator=False)
    return types.SimpleNamespace(kind=kind, device="cpu", chan=FakeChannel(), rng_random=lambda: 0.5,
                                 lap=lambda name, t0: 0, sync=lambda: None)


def test_the_arena_is_exported_once_and_each_buffer_described_by_its_offset_in_it(executor, monkeypatch):
    exports = []

    def export(ptr, nbytes):
        exports.append((ptr, nbytes))
        return {"ipc": f"handle{len(exports)}", "offset": 4096, "bytes": nbytes}

    monkeypatch.setattr(executor, "_export_range", export)
    w = worker()
    job = types.SimpleNamespace(role="candidate", seed=1, jitter_bytes=4096)
    template = [{"dtype": "float32", "shape": [64, 8]}, {"value": 3}, {"dtype": "int64", "shape": [5]}]
    ref = types.SimpleNamespace(input_template=template,
                                given_inputs=[[torch.randn(64, 8), 3, torch.arange(5)]])
    state = executor.ExecutorState((0, 0))

    def sets(calls):
        executor.make_buffers(w, job, ref, state, calls)
        msg = w.chan.sent[-1]
        assert msg["type"] == "buffers" and len(msg["sets"]) == calls
        base = state.arena.data_ptr()
        for one, descs in zip(state.buf_sets, msg["sets"]):
            assert descs[1] == {"value": True}
            for t, d in ((one[0], descs[0]), (one[2], descs[2])):
                assert d["ipc"] == f"handle{len(exports)}"
                assert d["offset"] == 4096 + t.data_ptr() - base
                assert d["addr"] == t.data_ptr() and d["bytes"] == t.numel() * t.element_size()
            assert torch.equal(one[0], ref.given_inputs[0][0]) and torch.equal(one[2], ref.given_inputs[0][2])
        return msg

    sets(3)
    assert exports == [(state.arena.data_ptr(), state.arena.numel())]
    sets(3)  # the next round: the same arena, no export
    sets(2)
    assert len(exports) == 1
    sets(5)  # a larger arena: exported once more
    assert len(exports) == 2 and exports[-1] == (state.arena.data_ptr(), state.arena.numel())
