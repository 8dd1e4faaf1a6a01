"""The harness's one table of what differs between the kinds of device (env/eval/harness/device.py,
DeviceKind): its rows, that nothing can change them, that the worker takes its --device choices
from it, and that no other module of the harness asks which kind of device it is on (the C++
side's table is env/eval/device_kind.hpp, checked by test_device_kind)."""
import re

import pytest

from conftest import HARNESS_DIR, OWN_MODULES


@pytest.fixture(scope="module")
def device(harness):
    return harness["device"]


def test_each_field_is_documented_and_each_row_names_its_kind(device):
    doc = device.DeviceKind.__doc__
    for field in device.DeviceKind._fields:
        assert re.search(rf"^    {field}\s", doc, re.M), f"DeviceKind.{field} is not described in its docstring"
    assert sorted(device.KINDS) == ["cpu", "cuda"]
    for name, kind in device.KINDS.items():
        assert kind.name == name
        assert device.kind_of(name) is kind
        assert callable(kind.synchronize)
    device.CPU.synchronize()  # nothing queued: returns at once, without a device


def test_the_cpu_row_has_none_of_the_devices_own_work_and_cuda_all_of_it(device):
    own = [f for f in device.DeviceKind._fields if f not in ("name", "synchronize", "profiler_activities",
                                                              "quiet_first_profile")]
    assert not any(getattr(device.CPU, f) for f in own)
    assert all(getattr(device.CUDA, f) for f in own)
    assert device.CPU.quiet_first_profile and not device.CUDA.quiet_first_profile
    assert len(device.CUDA.profiler_activities) == 2 and len(device.CPU.profiler_activities) == 1


def test_an_unknown_kind_is_refused_by_name(device):
    with pytest.raises(ValueError, match="unknown device kind 'tpu': the harness knows cpu, cuda"):
        device.kind_of("tpu")


def test_a_row_cannot_be_changed(device):
    with pytest.raises(AttributeError):
        device.CUDA.device_clock = False
    assert device.CUDA.device_clock is True


def test_the_workers_device_choices_are_the_tables_kinds(worker):
    with pytest.raises(SystemExit):
        worker.main(["--device", "tpu", "--scratch", "/tmp"])
    assert worker.KINDS is worker._OWN_MODULES["device"].KINDS


def test_no_other_module_of_the_harness_asks_which_kind_of_device_it_is_on():
    # A worker's kind is read through its row's fields (w.kind.exports, ...), never by comparing
    # its device's name; a tensor's own device (x.device.type) is that tensor's, and may be read.
    asks = re.compile(r"""\bw\.cuda\b|\bself\.cuda\b|\bdevice\s*[!=]=\s*["']cuda["']|["']cuda["']\s*[!=]=""")
    found = []
    for name in OWN_MODULES + ("worker",):
        if name == "device":
            continue
        for i, line in enumerate((HARNESS_DIR / f"{name}.py").read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if asks.search(code):
                found.append(f"{name}.py:{i}: {line.strip()}")
    assert not found, "\n".join(found)
