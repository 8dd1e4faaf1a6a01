"""What the tests of tests/service share: the crucible binary (CRUCIBLE_CLI, which ctest sets), a
tiny random model made on the spot, a token file, and `crucible serve` or `crucible serve-policy`
started on a free loopback port."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# A CPU verdict in about a second, as test_serve.cpp's: two trials, four rounds; the reference
# alone held to a band of 500% (other tests load the machine beside these, and the check of the
# reference's times is test_evaluator's to test).
FAST = ["--set", "evaluator.trials=2", "--set", "evaluator.rounds=4", "--set", "evaluator.min_rounds=4",
        "--set", "evaluator.max_rounds=4", "--set", "evaluator.buckets=2", "--set", "evaluator.warmup_ms=0",
        "--set", "evaluator.flush_bytes=1048576", "--set", "evaluator.recheck_above=1000",
        "--set", "evaluator.reference_band=5"]


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


def start(args, pattern, stderr):
    """`args` started (stderr into the file `stderr`), and what `pattern` finds in its first line of
    output (its address): the process and that address."""
    with open(stderr, "w") as err:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True)
    line = proc.stdout.readline()
    m = re.search(pattern, line)
    if not m:
        proc.kill()
        proc.wait()
        pytest.fail(f"crucible {args[1]} did not start: {line}{open(stderr).read()}")
    return proc, m.group(1)


def start_serve(token, *extra):
    """`crucible serve` on a free loopback port: the process and its address ("http://HOST:PORT")."""
    return start([crucible_cli(), "serve", "--listen", "127.0.0.1:0", "--token-file", str(token), *extra],
                 r"listening on (http://127\.0\.0\.1:\d+)", str(token) + ".serve.err")


def start_serve_policy(model, token, *extra):
    """`crucible serve-policy` on a free loopback port: the process and its base URL (".../v1")."""
    return start([crucible_cli(), "serve-policy", "--model", str(model), "--token-file", str(token), "--listen",
                  "127.0.0.1:0", *extra], r"listening on (http://127\.0\.0\.1:\d+/v1)", str(token) + ".policy.err")
