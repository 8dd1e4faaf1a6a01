#!/usr/bin/env python3
"""tools/escape_check.py --crucible BUILD/tools/crucible [--device cpu|cuda:N]: the escape suite
(tests/candidates/escape/) through `crucible eval`, on any machine and as any user: the same
attempts as the integration test "escape attempts ..." (tests/integration/test_evaluator_isolation.cpp),
against this user's home, the project tree, the harness, a stand-in run directory (task file,
token, config, verdict cache, extension cache), /tmp, /dev/shm, the evaluator, its zygote and a
sibling worker. Prints one line per check and exits 1 if any failed."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def children(pid):
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(name))
    return out


def named(comm):
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/comm") as f:
                if f.read().strip() == comm:
                    return True
        except OSError:
            pass
    return False


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--crucible", required=True)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    tag = f"crucible-escape-{os.getpid()}"
    home = os.path.expanduser("~")
    # Outside /tmp: inside the sandbox /tmp is the worker's own tmpfs, where anything goes.
    run = tempfile.mkdtemp(prefix="." + tag + "-run-", dir=home)
    task = os.path.join(run, "task.py")
    shutil.copy(os.path.join(ROOT, "env", "tasks", "cpu", "01_relu_scale.py"), task)
    files = {"token": "secret-token\n", "victim.txt": "keep me\n", "config.yaml": "run: {name: escape}\n"}
    for name, text in files.items():
        with open(os.path.join(run, name), "w") as f:
            f.write(text)
    home_secret = os.path.join(home, "." + tag + "-secret")
    with open(home_secret, "w") as f:
        f.write("home secret\n")
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    for cand in ("escape_python.py", "escape_cpp.py"):
        create = [os.path.join(home, tag), os.path.join(ROOT, tag), os.path.join(ROOT, "env", "eval", "harness", tag),
                  os.path.join(ROOT, "env", "tasks", "cpu", tag), os.path.join(run, "created"),
                  os.path.join(run, "extensions", tag)]
        private = [os.path.join(tempfile.gettempdir(), tag), os.path.join(tempfile.gettempdir(), "crucible", tag),
                   "/dev/shm/" + tag]
        append = [task, os.path.join(run, "config.yaml"), os.path.join(ROOT, "env", "eval", "harness", "worker.py")]
        victims = [os.path.join(run, "victim.txt"), os.path.join(run, "token")]
        secrets = [os.path.join(run, "token"), home_secret]
        before = {x: open(x, "rb").read() for x in append + victims}
        modes = {x: os.stat(x).st_mode for x in append}
        # The pids: this process and a stand-in victim of the same user (pid 1 would name the worker
        # itself inside its namespace). (The integration
        # test aims at the evaluator, its zygote and a sibling worker, whose pids exist only once
        # the evaluator runs; from inside the sandbox every pid outside it looks the same.)
        victim = subprocess.Popen(["sleep", "600"])
        targets = {"create": create, "append": append, "victims": victims, "secrets": secrets,
                   "pids": [os.getpid(), victim.pid], "leftover_name": "crucible-left", "fill_limit": 1 << 30}
        with open(os.path.join(ROOT, "tests", "candidates", "escape", cand)) as f:
            src = f.read().replace("@TARGETS@", json.dumps(targets))
        privates = "".join(f'try:\n    open("{x}", "w").write("x")\nexcept OSError:\n    pass\n' for x in private)
        src = src.replace("class ModelNew(nn.Module):", privates + "\n\nclass ModelNew(nn.Module):", 1)
        src_path = os.path.join(run, "candidate.py")
        with open(src_path, "w") as f:
            f.write(src)
        cmd = [args.crucible, "eval", "--task", task, "--candidate", src_path, "--device", args.device, "--no-cache",
               "--json", "--set", "evaluator.static_checks=false", "--set", "evaluator.scratch_mb=64",
               "--set", f"evaluator.extensions_dir={os.path.join(run, 'extensions')}",
               "--set", "evaluator.load_timeout_s=300"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        out, err = res.stdout, res.stderr
        check(victim.poll() is None, f"{cand}: the victim process lives")
        victim.kill()
        victim.wait()
        verdict = json.loads([l for l in out.splitlines() if l.startswith("{")][-1]) if "{" in out else {}
        check(verdict.get("status") == "ok", f"{cand}: verdict {verdict.get('status')}: {verdict.get('message', err[-500:])[:400]}")
        check("ESCAPED" not in verdict.get("message", ""), f"{cand}: no attempt succeeded inside")
        for x in create + private:
            check(not os.path.exists(x) and not os.path.exists(x + ".d"), f"{cand}: {x} not created")
        for x, data in before.items():
            check(os.path.exists(x) and open(x, "rb").read() == data, f"{cand}: {x} unchanged")
            check(not os.path.exists(x + ".moved"), f"{cand}: {x} not renamed")
        for x, mode in modes.items():
            check(os.stat(x).st_mode == mode, f"{cand}: {x} mode unchanged")
        by = time.time() + 30
        while named("crucible-left") and time.time() < by:
            time.sleep(0.05)
        check(not named("crucible-left"), f"{cand}: no process left behind")
    os.remove(home_secret)
    shutil.rmtree(run, ignore_errors=True)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
