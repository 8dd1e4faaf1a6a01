# task: env/tasks/cpu/01_relu_scale.py
"""Escape attempts through Python, made once when the model is built; then it computes the
task honestly. The test (tests/integration/test_evaluator_isolation.cpp, "escape attempts ...") fills in
TARGETS: files to create, files to append to, files to delete and rename, files to read, the
device files under /dev open to every user but the plain ones (a GPU's nodes on a GPU host: a CPU
worker that opened one could compute on the GPU, uncharged), and the pids of the evaluator, the
zygote and a sibling worker. Any attempt that succeeds is raised as
an error, so the verdict names it; the test also checks every target from outside."""
import ctypes
import errno
import json
import os
import time

import torch
import torch.nn as nn

TARGETS = json.loads(r"""@TARGETS@""")


def _attempts():
    escaped = []
    libc = ctypes.CDLL(None, use_errno=True)

    def tried(what, fn):
        try:
            if fn() is False:
                return
        except OSError:
            return
        escaped.append(what)

    def write(path, mode):
        with open(path, mode) as f:
            f.write("# written by a candidate\n")

    for path in TARGETS["create"]:
        tried("create " + path, lambda p=path: write(p, "w"))
        tried("mkdir " + path + ".d", lambda p=path: os.mkdir(p + ".d"))
    for path in TARGETS["append"]:
        tried("append to " + path, lambda p=path: write(p, "a"))
        tried("chmod " + path, lambda p=path: os.chmod(p, 0o777))
    for path in TARGETS["victims"]:
        tried("rename " + path, lambda p=path: os.rename(p, p + ".moved"))
        tried("delete " + path, lambda p=path: os.remove(p))
    for path in TARGETS["secrets"]:
        tried("read " + path, lambda p=path: open(p, "rb").read())
    for path in TARGETS["devices"]:
        tried("open " + path + " to write", lambda p=path: os.close(os.open(p, os.O_WRONLY | os.O_NOCTTY)))
        tried("open " + path + " to read", lambda p=path: os.close(os.open(p, os.O_RDONLY | os.O_NOCTTY)))
    buf = ctypes.create_string_buffer(64)

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    for pid in TARGETS["pids"]:
        tried(f"signal {pid}", lambda p=pid: os.kill(p, 0))
        tried(f"read /proc/{pid}/mem", lambda p=pid: open(f"/proc/{p}/mem", "rb").read(1))
        tried(f"read /proc/{pid}/environ", lambda p=pid: open(f"/proc/{p}/environ", "rb").read())

        def ptrace(p=pid):
            if libc.ptrace(ctypes.c_long(16), ctypes.c_long(p), None, None) != 0:  # PTRACE_ATTACH
                return False
            libc.ptrace(ctypes.c_long(17), ctypes.c_long(p), None, None)  # PTRACE_DETACH
        tried(f"ptrace {pid}", ptrace)

        def vm_read(p=pid):
            local = IoVec(ctypes.addressof(buf), 64)
            remote = IoVec(ctypes.addressof(buf), 64)  # where a forked sibling has the same buffer
            n = libc.process_vm_readv(p, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            # EFAULT means the kernel let us in and only the address was wrong.
            return n >= 0 or ctypes.get_errno() == errno.EFAULT
        tried(f"process_vm_readv {pid}", vm_read)

    # A process left behind: a daemon in a session of its own, named so the test can look for it.
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            libc.prctl(15, TARGETS["leftover_name"].encode(), 0, 0, 0)  # PR_SET_NAME
            time.sleep(600)
        os._exit(0)
    os.waitpid(child, 0)

    # Filling the disk: the scratch directory ends in ENOSPC, a size the evaluator set.
    block = b"\0" * (1 << 20)
    written = 0
    try:
        with open("fill.bin", "wb", buffering=0) as f:
            while written < TARGETS["fill_limit"]:
                written += f.write(block)
        escaped.append(f"wrote {written} bytes to the scratch directory without ENOSPC")
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EFBIG):
            escaped.append(f"filling the disk ended in {e!r}, not ENOSPC")
    finally:
        if os.path.exists("fill.bin"):
            os.remove("fill.bin")
    return escaped


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        escaped = _attempts()
        if escaped:
            raise RuntimeError("ESCAPED: " + "; ".join(escaped))
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max

    def forward(self, x):
        return torch.clamp(torch.relu(x * self.scale + self.shift), max=self.clamp_max)
