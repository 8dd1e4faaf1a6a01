"""executor.py's receive_trial_inputs on a CUDA device: a trial's inputs stay on the device where
the evaluator copied them while all the trials' so far fit in an eighth of the device's free
memory, and go to host memory past that (the first trial's page-locked); on a device that does not
report its memory, all go to host memory. The device's side (receive_device_inputs) is replaced
here by a recorder: this machine has no CUDA device."""
import types


class FakeChannel:
    def __init__(self, messages):
        self.messages = list(messages)

    def recv_frames(self):
        return self.messages.pop(0), []


def inputs_message(nbytes):
    # One float32 tensor of nbytes bytes.
    return {"type": "inputs", "on_device": True, "inputs": [{"dtype": "float32", "shape": [nbytes // 4]}]}


def received(executor, monkeypatch, sizes, free, memory_info=True):
    calls = []

    def recorder(w, descs, keep=False, pinned=False):
        calls.append((keep, pinned))
        return ["trial"]

    monkeypatch.setattr(executor, "receive_device_inputs", recorder)
    monkeypatch.setattr(executor, "_cuda_mem_get_info", lambda: (free, 4 * free))
    w = types.SimpleNamespace(kind=types.SimpleNamespace(memory_info=memory_info),
                              chan=FakeChannel([inputs_message(n) for n in sizes] + [{"type": "run"}]),
                              lap=lambda name, t0: 0)
    ref = types.SimpleNamespace()
    executor.receive_trial_inputs(w, ref)
    assert ref.trials == len(sizes)
    return calls


def test_the_trials_inputs_stay_on_the_device_while_they_fit_in_an_eighth_of_its_free_memory(executor, monkeypatch):
    gib = 1 << 30
    # Five trials of 1 GiB with 40 GiB free: a budget of 5 GiB holds them all.
    assert received(executor, monkeypatch, [gib] * 5, 40 * gib) == [(True, True)] + [(True, False)] * 4
    # With 20 GiB free (a budget of 2.5 GiB): two stay, the rest go to host memory.
    assert received(executor, monkeypatch, [gib] * 5, 20 * gib) == [(True, True), (True, False)] + [(False, False)] * 3
    # KernelBench level1/76's 8 GiB inputs with 120 GiB free (a budget of 15 GiB): one stays; at a
    # quarter three stayed, beside the trials' outputs, and the device ran out.
    assert received(executor, monkeypatch, [8 * gib] * 4, 120 * gib) == [(True, True)] + [(False, False)] * 3
    # A first trial past the budget goes to host memory page-locked (every timing round copies it).
    assert received(executor, monkeypatch, [17 * gib] * 3, 120 * gib) == [(False, True), (False, False), (False, False)]
    # A device that does not report its memory: host memory for all.
    assert received(executor, monkeypatch, [1024] * 2, 40 * gib, memory_info=False) == [(False, True), (False, False)]
