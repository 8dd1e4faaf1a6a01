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
        executor.make_buffers(w, job, ref, None, state, calls)
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


def test_the_reference_workers_buffers_start_with_its_last_draw_where_its_draw_arena_holds_one(executor,
                                                                                                monkeypatch):
    monkeypatch.setattr(executor, "_export_range", lambda ptr, nbytes: {"ipc": "h", "offset": 0, "bytes": nbytes})
    made = []

    def make_inputs(task, device, seed, dist):
        made.append((seed, dist))
        return [torch.full((64, 8), 7.0), 3, torch.arange(5)]

    monkeypatch.setattr(executor, "make_inputs", make_inputs)
    w = worker()
    job = types.SimpleNamespace(role="reference", seed=11, jitter_bytes=0, baseline="eager")
    template = [{"dtype": "float32", "shape": [64, 8]}, {"value": 3}, {"dtype": "int64", "shape": [5]}]
    ref = types.SimpleNamespace(input_template=template, task=None, trial_dists=[0])
    state = executor.ExecutorState((0, 0))
    # No draw yet: the first trial's inputs, made again.
    executor.make_buffers(w, job, ref, None, state, 2)
    assert made == [(11, 0)]
    assert all(torch.equal(one[0], torch.full((64, 8), 7.0)) for one in state.buf_sets)
    # A draw in the arena, laid out as draw lays out a call (_room: each input at a 512-byte step).
    slots, per_call = executor._room(template)
    state.draw_arena = torch.zeros(per_call * 3, dtype=torch.uint8)
    x, idx = torch.randn(64, 8), torch.tensor([4, 3, 2, 1, 0])
    for t, sl in ((x, slots[0]), (idx, slots[2])):
        state.draw_arena[sl[3]:sl[3] + sl[2]].view(t.dtype).copy_(t.reshape(-1))
    executor.make_buffers(w, job, ref, None, state, 2)
    assert made == [(11, 0)]  # nothing made again
    for one in state.buf_sets:
        assert torch.equal(one[0], x) and one[1] == 3 and torch.equal(one[2], idx)
        assert one[0].data_ptr() != state.draw_arena.data_ptr()  # copies in the buffers' own arena


def test_what_a_timed_call_calls_by_side_and_baseline(executor, harness):
    # The candidate's model and the eager or compiled reference, called directly; with
    # compile-reduce-overhead a new step of its graphs before every call (their outputs are
    # overwritten at the next one).
    state = executor.ExecutorState((0, 0))
    state.buf_sets = [[1], [3], [4]]

    def call(job, baseline, cand, i):
        fn, args = executor.executor_call(job, baseline, cand, state, i)
        return fn(*args)

    model = lambda x: x + 1  # noqa: E731
    cand = types.SimpleNamespace(model=model)
    job = types.SimpleNamespace(role="candidate", baseline="compile-reduce-overhead")
    assert call(job, None, cand, 0) == 2
    assert executor.executor_call(job, None, cand, state, 0) == (model, [1])  # no frame between
    steps = []
    stepped = harness["reference"].Baseline(None, lambda x: x * 2, lambda: steps.append(1))
    job = types.SimpleNamespace(role="reference", baseline="compile-reduce-overhead")
    assert (call(job, stepped, None, 1), call(job, stepped, None, 2)) == (6, 8) and steps == [1, 1]
    eager = harness["reference"].Baseline(None, lambda x: x * 3)
    job = types.SimpleNamespace(role="reference", baseline="eager")
    assert call(job, eager, None, 1) == 9
    # cuda-graph: the replay of set i's graph, whose outputs it hands back.
    replays = []
    state.graphs = [(types.SimpleNamespace(replay=lambda i=i: replays.append(i)), f"out{i}") for i in range(2)]
    job = types.SimpleNamespace(role="reference", baseline="cuda-graph")
    graph = harness["reference"].Baseline(None, None)
    assert (call(job, graph, None, 1), call(job, graph, None, 0)) == ("out1", "out0") and replays == [1, 0]
