"""docs/service.md's commands and code blocks, run as a reader runs them (each block marked
`<!-- doc-test: NAME -->` in the file), against a real `crucible serve` on the CPU, from a directory
outside the checkout. The only changes made to a block are the ones a reader's machine makes: the
address (the docs' 127.0.0.1:8470, a fixed port, becomes a free one), the binary's path
(build/tools/crucible) and the model the TRL block names (a tiny model made here: nothing is
downloaded). A marked block that stops working fails here, and so does a marked block this file
does not run. CRUCIBLE_CLI is the crucible binary (ctest sets it)."""
import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python"))

from servers import crucible_cli, tiny_model  # noqa: E402

DOC = ROOT / "docs" / "service.md"
RUN_HERE = {"serve", "client", "trl", "verl", "openenv"}


def marked_blocks():
    """NAME -> (language, code) of each block the doc marks."""
    text = DOC.read_text()
    found = {}
    for m in re.finditer(r"<!-- doc-test: (\w+) -->\n```(\w+)\n(.*?)\n```", text, re.S):
        assert m.group(1) not in found, f"docs/service.md marks two blocks '{m.group(1)}'"
        found[m.group(1)] = (m.group(2), m.group(3))
    return found


BLOCKS = marked_blocks()


def test_every_marked_block_is_run_here():
    assert set(BLOCKS) == RUN_HERE


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The serve block run in a fresh directory: its commands one by one, the server in the
    background; what it prints checked against the block's own comment. The directory and the
    server's address."""
    cli = crucible_cli()
    d = tmp_path_factory.mktemp("reader")
    lang, code = BLOCKS["serve"]
    assert lang == "sh"
    commands = [line for line in code.splitlines() if line.strip() and not line.startswith("#")]
    expected = [line[2:] for line in code.splitlines() if line.startswith("# ")]
    assert len(commands) == 2 and len(expected) == 1, code
    token_cmd, serve_cmd = commands
    subprocess.run(["bash", "-c", token_cmd], cwd=d, check=True)
    assert (d / "token").stat().st_mode & 0o077 == 0
    argv = serve_cmd.split("#")[0].split()
    assert argv[0] == "build/tools/crucible"
    argv[0] = cli
    argv = [a.replace("127.0.0.1:8470", "127.0.0.1:0") for a in argv]
    err = open(d / "serve.err", "w")
    proc = subprocess.Popen(argv, cwd=d, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True)
    line = proc.stdout.readline().rstrip("\n")
    # The docs' line, with the port this machine gave and the suite where this checkout keeps it.
    want = re.escape(expected[0]).replace("8470", r"(\d+)").replace(re.escape("env/tasks/cpu"), r"\S*env/tasks/cpu")
    m = re.fullmatch(want, line)
    if not m:
        proc.kill()
        proc.wait()
        pytest.fail(f"the server printed {line!r}, the docs say {expected[0]!r}: {open(d / 'serve.err').read()}")
    yield d, f"127.0.0.1:{m.group(1)}"
    proc.terminate()
    assert proc.wait(timeout=60) == 0


def run_python(name, where, address, replace=()):
    """Block NAME run in `where` with the docs' address replaced; its last expression's value."""
    lang, code = BLOCKS[name]
    assert lang == "python"
    code = code.replace("127.0.0.1:8470", address)
    for old, new in replace:
        assert old in code, f"block {name} no longer holds {old!r}"
        code = code.replace(old, new)
    tree = ast.parse(code)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    scope = {"__name__": f"doc_{name}"}
    was = os.getcwd()
    os.chdir(where)
    try:
        exec(compile(tree, f"docs/service.md ({name})", "exec"), scope)
        value = eval(compile(ast.Expression(last.value), f"docs/service.md ({name})", "eval"), scope) if last else None
    finally:
        os.chdir(was)
    return value, scope


def test_the_client_block_gets_a_verdict(served):
    d, address = served
    (d / "mine.py").write_text((ROOT / "env/tasks/cpu/variants/01_relu_scale/fast_inplace.py").read_text())
    verdict, _ = run_python("client", d, address)
    assert verdict["status"] == "ok", verdict
    assert verdict["correct"] is True


def test_the_verl_block_makes_a_compute_score(served):
    d, address = served
    _, scope = run_python("verl", d, address)
    code = (ROOT / "env/tasks/cpu/variants/01_relu_scale/wrong_clamp_before_shift.py").read_text()
    score = scope["compute_score"]("crucible", f"```python\n{code}```", "01_relu_scale", {})
    assert isinstance(score, float)
    assert score == 0.0  # an incorrect candidate's reward (reward.failed) with the service's defaults


def test_the_trl_block_trains_on_a_cpu(served, tmp_path):
    # The block as written on a machine without a GPU, with a model directory of its own (the
    # tiny model crucible makes, chat template included) in place of the hub's.
    d, address = served
    model = tiny_model(tmp_path)
    _, scope = run_python("trl", d, address, replace=[('"Qwen/Qwen2.5-Coder-1.5B-Instruct"', repr(str(model)))])
    trainer = scope["trainer"]
    rewards = [e for e in trainer.state.log_history if "reward" in e]
    assert rewards, trainer.state.log_history
    assert trainer.state.global_step >= 1


def test_the_openenv_block_starts_a_server_beside_the_service(served):
    # The command as written (the checkout's interpreter, the package from the checkout), its
    # banner as the docs print it, and a session through openenv's client.
    d, address = served
    lang, code = BLOCKS["openenv"]
    assert lang == "sh"
    command = " ".join(line.rstrip("\\").strip() for line in code.splitlines() if not line.startswith("#"))
    expected = [line[2:] for line in code.splitlines() if line.startswith("# ")]
    argv = command.split()
    assert argv[0] == ".venv/bin/python"
    argv[0] = sys.executable
    argv = [a.replace("127.0.0.1:8470", address).replace("127.0.0.1:8480", "127.0.0.1:0") for a in argv]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "clients" / "python"))
    proc = subprocess.Popen(argv, cwd=d, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        line = proc.stdout.readline().rstrip("\n")
        want = re.escape(expected[0]).replace("8480", r"(\d+)").replace("8470", re.escape(address.split(":")[1]))
        m = re.fullmatch(want, line)
        assert m, f"the server printed {line!r}, the docs say {expected[0]!r}"
        from crucible_client.openenv_env import KernelEnv

        with KernelEnv(base_url=f"http://127.0.0.1:{m.group(1)}").sync() as env:
            r = env.reset(task="01_relu_scale")
            assert r.observation.turns_total == 2 and r.observation.messages
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
