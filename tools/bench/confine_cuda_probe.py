#!/usr/bin/env python3
"""tools/bench/confine_cuda_probe.py: which layer of the workers' sandbox (env/harness/confine.py)
a CUDA process needs lifted, if any. For each variant (all layers; then each of identity,
Landlock, seccomp, PID namespace, read-only remount, private scratch left out) a child of a
process with torch imported confines itself and initialises CUDA, allocates and runs a matmul;
prints each variant's outcome with the full traceback."""
import importlib.util
import json
import os
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("confine", os.path.join(HERE, "..", "..", "env", "harness", "confine.py"))
confine = importlib.util.module_from_spec(spec)
spec.loader.exec_module(confine)
import torch  # noqa: E402

_landlock = confine._landlock


def landlock_plus(extra_read=(), extra_write=()):
    """Landlock with more paths readable (or writable) than the workers get."""
    return lambda report, readable, writable, files_writable: _landlock(
        report, list(readable) + list(extra_read), list(writable) + list(extra_write), files_writable)


VARIANTS = {
    "all": {},
    "no identity": {"_identity": lambda report, owned: None},
    "no landlock": {"_landlock": lambda *a: None},
    "landlock, everything readable": {"_landlock": landlock_plus(["/"])},
    "landlock, /var readable": {"_landlock": landlock_plus(["/var"])},
    "landlock, /run readable": {"_landlock": landlock_plus(["/run"])},
    "landlock, /root and /home readable": {"_landlock": landlock_plus(["/root", "/home"])},
    "landlock, /dev writable": {"_landlock": landlock_plus((), ["/dev"])},
    "landlock, /proc writable": {"_landlock": landlock_plus((), ["/proc"])},
    "no seccomp": {"_seccomp": lambda report: None},
}


def run(name, patches):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        out = {"variant": name}
        try:
            for k, v in patches.items():
                setattr(confine, k, v)
            scratch = tempfile.mkdtemp(prefix="crucible-probe-")
            out["isolation"] = confine.enter_worker(scratch, None, os.path.join(HERE, "..", "..", "env", "harness"), 256)
            out["uid"] = os.getuid()
            torch.cuda.init()
            a = torch.randn(256, 256, device="cuda")
            out["matmul"] = float((a @ a).sum().item())
            out["ok"] = True
        except BaseException:  # noqa: BLE001
            out["ok"] = False
            out["error"] = traceback.format_exc()[-3000:]
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    return json.loads(data or b"{}")


for name, patches in VARIANTS.items():
    res = run(name, patches)
    print(name, "OK" if res.get("ok") else "FAILED", "missing:", (res.get("isolation") or {}).get("missing"))
    if not res.get("ok"):
        print(res.get("error"))
    sys.stdout.flush()
