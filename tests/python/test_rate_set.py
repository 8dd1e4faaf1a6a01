# tools/bench/rate_set.py: a set of CUDA-L1 pairs out of a release (hand-made release files, the
# script as a subprocess): picks by kind spread over the release, identical code from the first
# PyTorch-only picks, --also's pairs of another release at the end, and errors that name what is wrong.
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "bench" / "rate_set.py"
TORCH = "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n"
INLINE = "from torch.utils.cpp_extension import load_inline\nclass ModelNew:\n    pass\n"
REF = "import torch\nclass Model(torch.nn.Module):\n    pass\n"


def release(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def row(level, task, code):
    return {"level_id": level, "task_id": task, "custom_code": code, "ref_code": REF}


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def read(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_picks_kinds_and_identity_and_adds_pairs_of_another_release(tmp_path):
    h100 = release(tmp_path / "h100.json", [row(1, t, TORCH) for t in range(1, 5)] + [row(2, 7, INLINE), row(3, 1, TORCH)])
    other = release(tmp_path / "3090.json", [row(1, 12, INLINE), row(1, 40, TORCH)])
    out = tmp_path / "set"
    r = run(h100, out, "--torch", 2, "--inline", 1, "--self", 1, "--copies", 2,
            "--also", f"{other}:1/12", "--also", f"{other}:1/40")
    assert r.returncode == 0, r.stderr
    pairs = read(out / "set.jsonl")
    assert [p["kind"] for p in pairs] == ["torch", "torch", "inline", "self", "inline", "torch"]
    assert [(p["level_id"], p["task_id"]) for p in pairs] == [(1, 1), (1, 3), (2, 7), (1, 1), (1, 12), (1, 40)]
    assert "class ModelNew" in pairs[3]["custom_code"] and "Model(" not in pairs[3]["custom_code"]
    assert pairs[4]["name"] == "L1_T12 (CUDA-L1 3090 release)"
    assert len(read(out / "copies.jsonl")) == 12
    assert json.loads((out / "kinds.json").read_text())["set.jsonl"][-2:] == ["inline", "torch"]


def test_also_names_what_is_wrong(tmp_path):
    h100 = release(tmp_path / "h100.json", [row(1, 1, TORCH), row(2, 7, INLINE)])
    other = release(tmp_path / "3090.json", [row(1, 12, "None")])
    cases = [("nonsense", "expected RELEASE:LEVEL/TASK"),
             (f"{other}:1/99", "no pair of level 1, task 99"),
             (f"{other}:1/12", "that pair has no candidate"),
             (f"{tmp_path / 'missing.json'}:1/12", "missing.json")]
    for spec, says in cases:
        r = run(h100, tmp_path / "set", "--torch", 1, "--inline", 1, "--self", 0, "--also", spec)
        assert r.returncode != 0
        assert says in r.stderr, r.stderr


def test_a_release_line_that_is_not_an_object_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(row(1, 1, TORCH)) + "\n[1, 2]\n", encoding="utf-8")
    r = run(bad, tmp_path / "set", "--torch", 1, "--inline", 0, "--self", 0)
    assert r.returncode != 0
    assert f"{bad}:2: a JSON list, expected one object a line" in r.stderr, r.stderr
