"""A CUDA worker gives up the host's other GPUs' device files once its context exists
(device.py, other_gpu_files and DeviceKind.other_device_files; confine.py, narrow_devices): the
files named from the driver's /proc files, and a second Landlock layer that leaves exactly those
out. CPU only: the /proc and /dev trees here are made for the test, and the layer is put on a child
process with the plain device files."""
import json
import subprocess
import sys

import pytest

from conftest import HARNESS_DIR


@pytest.fixture(scope="module")
def device(harness):
    return harness["device"]


def _host(tmp_path, minor_line):
    gpus, dev = tmp_path / "gpus", tmp_path / "dev"
    (gpus / "0000:18:00.0").mkdir(parents=True)
    (gpus / "0000:18:00.0" / "information").write_text(
        "Model: \t\t NVIDIA H200\nIRQ:   \t\t 512\nGPU UUID: \t GPU-0\n" + minor_line + "Bus Location: \t 0000:18:00.0\n")
    dev.mkdir()
    for n in ("nvidia0", "nvidia1", "nvidia12", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "null"):
        (dev / n).write_text("")
    return str(gpus), str(dev)


def test_the_other_gpus_files_are_every_nvidia_n_but_the_one_of_the_gpus_own_minor(device, tmp_path):
    gpus, dev = _host(tmp_path, "Device Minor: \t 1\n")
    assert device.other_gpu_files("0000:18:00.0", gpus, dev) == [f"{dev}/nvidia0", f"{dev}/nvidia12"]


def test_an_unknown_minor_is_an_error_naming_the_file_and_the_way_out(device, tmp_path):
    gpus, dev = _host(tmp_path, "")
    with pytest.raises(RuntimeError, match=r"0000:18:00.0/information: no \"Device Minor\" line"):
        device.other_gpu_files("0000:18:00.0", gpus, dev)
    with pytest.raises(RuntimeError, match=r"0000:3b:00.0/information: .*evaluator.cuda_own_device_only: false"):
        device.other_gpu_files("0000:3b:00.0", gpus, dev)


def test_the_cuda_row_gives_up_other_gpus_and_the_cpu_row_nothing(device):
    assert device.CPU.other_device_files is None
    assert callable(device.CUDA.other_device_files)


_CHILD = r"""
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("confine_under_test", sys.argv[1])
c = importlib.util.module_from_spec(spec)
spec.loader.exec_module(c)
out = {"abi": c.landlock_abi()}
if out["abi"] > 0:
    out["before"] = c.narrow_devices(["/dev/zero"])  # no layer yet: nothing to narrow
    readable = sorted({sys.prefix, sys.base_prefix, "/usr", "/lib", "/etc"})
    report = c.Report(("landlock",))
    c._landlock(report, readable, ["/tmp"], ["/dev", "/proc"])
    c._WORKER_RULES[:] = [(readable, ["/tmp"])]
    def opens(p):
        try:
            os.close(os.open(p, os.O_RDONLY))
            return True
        except OSError:
            return False
    out["zero_first"] = opens("/dev/zero")
    out["narrowed"] = c.narrow_devices(["/dev/zero"])
    out["zero"], out["null"] = opens("/dev/zero"), opens("/dev/null")
    out["listed"] = "zero" in os.listdir("/dev")
    # a child process keeps the layer
    pid = os.fork()
    if pid == 0:
        os._exit(0 if not opens("/dev/zero") else 1)
    out["child_closed"] = os.waitpid(pid, 0)[1] == 0
print(json.dumps(out))
"""


def test_narrowing_leaves_out_the_dropped_device_files_for_the_worker_and_its_children():
    r = subprocess.run([sys.executable, "-c", _CHILD, str(HARNESS_DIR / "confine.py")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    if out["abi"] <= 0:
        pytest.skip("no Landlock on this kernel")
    assert out == {"abi": out["abi"], "before": False, "zero_first": True, "narrowed": True, "zero": False,
                   "null": True, "listed": True, "child_closed": True}
