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


def test_level_takes_every_pair_of_that_level_with_a_candidate_in_task_order(tmp_path):
    h100 = release(tmp_path / "h100.json", [row(1, 3, INLINE), row(1, 1, TORCH), row(2, 2, TORCH),
                                            row(1, 2, "None"), row(1, 4, "import triton\n")])
    out = tmp_path / "l1"
    r = run(h100, out, "--level", 1, "--copies", 1)
    assert r.returncode == 0, r.stderr
    pairs = read(out / "set.jsonl")
    assert [(p["task_id"], p["kind"]) for p in pairs] == [(1, "torch"), (3, "inline"), (4, "triton")]
    assert "3 pairs (1 torch, 1 inline, 1 triton, 0 self)" in r.stdout
    r = run(h100, tmp_path / "l3", "--level", 3)
    assert r.returncode != 0
    assert "has no pair of level 3 with a candidate" in r.stderr


BOUNDS = """# a bounds table

| task | GFLOP | MB moved | bound (ms) | reference (ms) | fraction |
|---|---:|---:|---:|---:|---:|
| 1_Square | 137.44 | 201.3 | 0.3317 | 2.7301 | 0.122 |
| 12_Diag | 0.00 | 134.2 | 0.0314 | 0.0651 | 0.482 |
| 40_Norm | 0.00 | 100.0 | 0.0300 | 0.0400 | 0.750 |

After the table.
"""


def test_bounds_table_puts_each_kernel_beside_its_task_and_names_any_above_the_bound(tmp_path):
    script = SCRIPT.parent / "bounds_table.py"
    table = tmp_path / "bounds.md"
    table.write_text(BOUNDS, encoding="utf-8")
    recs = tmp_path / "rec.jsonl"
    recs.write_text("".join(json.dumps(r) + "\n" for r in [
        {"level_id": 1, "task_id": 1, "status": "ok", "speedup": 1.5, "fraction": 0.2, "fraction_of": "ms",
         "bound": {"ms": 0.04133}, "ref_fraction": 0.133, "input": {"score_default": 1.2}},
        {"level_id": 1, "task_id": 12, "status": "ok", "speedup": 45.0, "fraction": 1.02, "fraction_of": "bytes_ms",
         "bound": {"ms": 0.336, "bytes_ms": 0.0314}},
        {"task": "level1/40", "status": "incorrect", "speedup": None, "fraction": None}]), encoding="utf-8")
    r = subprocess.run([sys.executable, str(script), str(table), str(recs)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[2].endswith("| fraction | CUDA-L1 kernel here | its speedup | its bound (ms) | its fraction | "
                             "its reference's fraction | CUDA-L1's figure |")
    assert lines[4].endswith("| 0.122 | ok | 1.50x | 0.0413 | 0.200 | 0.133 | 1.20x |")
    assert lines[5].endswith("| 0.482 | ok | 45.00x | 0.0314 | 1.020 (bytes part) | - | - |")
    assert lines[6].endswith("| 0.750 | incorrect | - | - | - | - | - |")
    assert lines[-1] == "After the table."
    assert "3 of 3 tasks with a record, 2 ok; highest fraction of an ok kernel 1.020; above 1.0: 12 (1.020)" in r.stderr
    bad = subprocess.run([sys.executable, str(script), str(recs), str(recs)], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "no task rows" in bad.stderr


def test_bounds_table_fills_a_filled_table_where_records_are_and_keeps_its_other_rows(tmp_path):
    script = SCRIPT.parent / "bounds_table.py"
    table = tmp_path / "bounds.md"
    table.write_text(BOUNDS, encoding="utf-8")
    first = tmp_path / "first.jsonl"
    first.write_text(json.dumps({"level_id": 1, "task_id": 12, "status": "ok", "speedup": 45.0, "fraction": 0.57,
                                 "fraction_of": "bytes_ms", "bound": {"ms": 0.336, "bytes_ms": 0.0314},
                                 "ref_fraction": 0.12}) + "\n", encoding="utf-8")
    r = subprocess.run([sys.executable, str(script), str(table), str(first)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    filled = tmp_path / "filled.md"
    filled.write_text(r.stdout, encoding="utf-8")
    # A second run's records: task 40 (not reached before) and task 1; task 12's cells stay.
    second = tmp_path / "second.jsonl"
    second.write_text("".join(json.dumps(x) + "\n" for x in [
        {"level_id": 1, "task_id": 40, "status": "ok", "speedup": 11.7, "fraction": 1.2, "fraction_of": "ms",
         "bound": {"ms": 0.002}, "ref_fraction": 0.015},
        {"level_id": 1, "task_id": 1, "status": "incorrect"}]), encoding="utf-8")
    r2 = subprocess.run([sys.executable, str(script), str(filled), str(second)], capture_output=True, text=True,
                        timeout=60)
    assert r2.returncode == 0, r2.stderr
    lines = r2.stdout.splitlines()
    assert lines[2] == r.stdout.splitlines()[2] and lines[3] == r.stdout.splitlines()[3]  # header and rule once
    assert lines[4].endswith("| 0.122 | incorrect | - | - | - | - | - |")
    assert lines[5] == r.stdout.splitlines()[5]  # task 12 kept
    assert lines[6].endswith("| 0.750 | ok | 11.70x | 0.002 | 1.200 | 0.015 | - |")
    assert "3 of 3 tasks with a record, 2 ok; highest fraction of an ok kernel 1.200; above 1.0: 40 (1.200)" in r2.stderr
    # Filling it again with nothing new changes nothing.
    again = tmp_path / "again.md"
    again.write_text(r2.stdout, encoding="utf-8")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    r3 = subprocess.run([sys.executable, str(script), str(again), str(empty)], capture_output=True, text=True, timeout=60)
    assert r3.returncode == 0 and r3.stdout == r2.stdout
