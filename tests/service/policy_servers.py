"""What the tests of tests/service that need a model share: the crucible binary (CRUCIBLE_CLI,
which ctest sets), a tiny random model made on the spot, a token file, and `crucible serve-policy`
started on a free loopback port."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def crucible_cli():
    path = os.environ.get("CRUCIBLE_CLI")
    if not path:
        pytest.skip("CRUCIBLE_CLI is not set (ctest sets it)")
    return path


def tiny_model(d):
    """A tokenizer trained on docs/ and a tiny random Qwen2 in d/"model" (chat template included)."""
    c = crucible_cli()
    subprocess.run([c, "tokenizer", "train", "--corpus", os.path.join(ROOT, "docs"), "--vocab", "600", "--out",
                    str(d / "tok")], check=True, capture_output=True)
    subprocess.run([c, "init-model", "--preset", "tiny", "--tokenizer", str(d / "tok"), "--out", str(d / "model"),
                    "--seed", "3"], check=True, capture_output=True)
    return d / "model"


def token_file(path, token):
    path.write_text(token + "\n")
    path.chmod(0o600)  # a token file others may read is refused
    return path


def start_serve_policy(model, token, *extra):
    """`crucible serve-policy` on a free loopback port: the process and its base URL (".../v1")."""
    proc = subprocess.Popen([crucible_cli(), "serve-policy", "--model", str(model), "--token-file", str(token),
                             "--listen", "127.0.0.1:0", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()
    m = re.search(r"listening on (http://127\.0\.0\.1:\d+/v1)", line)
    if not m:
        proc.kill()
        pytest.fail("crucible serve-policy did not start: " + line + proc.stderr.read())
    return proc, m.group(1)
