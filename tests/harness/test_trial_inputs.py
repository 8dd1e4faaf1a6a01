"""executor.py's receive_trial_inputs on a CUDA device: a trial's inputs stay on the device where
the evaluator copied them while all the trials' so far fit in an eighth of the device's free
memory. Past that, the first trial's go to page-locked host memory and each later trial's are
asked for when that trial runs (`later` at once; `trial_inputs` then, answered with the trial's
`inputs` and room made then, kept on the device). On a device that does not report its memory the
first goes to host memory and the others are asked for later. The device's side
(receive_device_inputs) is replaced here by a recorder: this machine has no CUDA device."""
import types

import pytest


class FakeChannel:
    def __init__(self, messages):
        self.messages = list(messages)
        self.sent = []

    def recv_frames(self):
        return self.messages.pop(0), []

    def recv(self):
        return self.messages.pop(0)

    def send(self, msg):
        self.sent.append(msg)


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
    # A trial asked for later answered `later` at once, and holds a call that asks for it.
    later = [t for t, given in enumerate(ref.given_inputs) if callable(given)]
    assert w.chan.sent == [{"type": "later"}] * len(later)
    return calls + [("later", t) for t in later]


def test_the_trials_inputs_stay_on_the_device_while_they_fit_in_an_eighth_of_its_free_memory(executor, monkeypatch):
    gib = 1 << 30
    # Five trials of 1 GiB with 40 GiB free: a budget of 5 GiB holds them all.
    assert received(executor, monkeypatch, [gib] * 5, 40 * gib) == [(True, True)] + [(True, False)] * 4
    # With 20 GiB free (a budget of 2.5 GiB): two stay, the rest are asked for as they run.
    assert received(executor, monkeypatch, [gib] * 5, 20 * gib) == [(True, True), (True, False)] + [
        ("later", 2), ("later", 3), ("later", 4)]
    # KernelBench level1/76's 8 GiB inputs with 120 GiB free (a budget of 15 GiB): one stays; at a
    # quarter three stayed, beside the trials' outputs, and the device ran out.
    assert received(executor, monkeypatch, [8 * gib] * 4, 120 * gib) == [(True, True)] + [
        ("later", 1), ("later", 2), ("later", 3)]
    # A first trial past the budget goes to host memory page-locked (every timing round copies it).
    assert received(executor, monkeypatch, [17 * gib] * 3, 120 * gib) == [(False, True), ("later", 1), ("later", 2)]
    # A device that does not report its memory: the first to host memory, the others later.
    assert received(executor, monkeypatch, [1024] * 2, 40 * gib, memory_info=False) == [(False, True), ("later", 1)]


def test_a_trial_asked_for_later_is_asked_for_by_number_and_stays_on_the_device(executor, monkeypatch):
    calls = []

    def recorder(w, descs, keep=False, pinned=False):
        calls.append((descs, keep, pinned))
        return ["on the device"]

    monkeypatch.setattr(executor, "receive_device_inputs", recorder)
    chan = FakeChannel([inputs_message(64)])
    w = types.SimpleNamespace(chan=chan)
    fetch = executor._later_inputs(w, 3)
    assert chan.sent == []  # nothing asked for until the trial runs
    assert fetch() == ["on the device"]
    assert chan.sent == [{"type": "trial_inputs", "trial": 3}]
    assert calls == [([{"dtype": "float32", "shape": [16]}], True, False)]


def test_a_trial_asked_for_later_refuses_an_answer_that_is_not_its_inputs_on_the_device(executor, harness):
    w = types.SimpleNamespace(chan=FakeChannel([{"type": "inputs", "inputs": []}]))
    with pytest.raises(harness["channel"]._Done) as e:
        executor._later_inputs(w, 2)()
    assert e.value.status == "runtime_error"
    assert e.value.message == "expected trial 2's inputs on the device, got 'inputs'"
