"""A fixed model behind an endpoint (`policy.backend: openai`) runs crucible's contrastive search
without a learner, against a real `crucible serve-policy` on loopback, on the CPU: the run
completes, its replay store, status and report are a normal run's, a pause and resume go on where
the run stopped, and a wrong endpoint, model or schedule is refused before anything starts.
CRUCIBLE_CLI is the crucible binary (ctest sets it)."""
import json
import os
import sqlite3
import subprocess

import pytest

from servers import ROOT, crucible_cli as cli, start_serve_policy, tiny_model, token_file

TOKEN = "search-test-token-0123456789"


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("search")
    token = token_file(d / "token", TOKEN)
    proc, url = start_serve_policy(tiny_model(d), token, "--served-model-name", "fixed")
    yield {"url": url, "token": str(token), "dir": d}
    proc.terminate()
    assert proc.wait(timeout=60) == 0


def train(endpoint, run_dir, *extra, command="train"):
    args = [cli(), command]
    if command == "train":
        args += [os.path.join(ROOT, "configs", "quickstart.yaml")]
    else:
        args += [str(run_dir / "quickstart")]
    if command == "train":
        args += ["--set", f"run.dir={run_dir}", "--set", "policy.backend=openai", "--set",
                 f"policy.base_url={endpoint['url']}", "--set", "policy.model=fixed", "--set",
                 f"policy.api_key_file={endpoint['token']}", "--set", "policy.token_ids=true", "--set",
                 "policy.logprobs=true", "--set", "stages.sft.steps=0", "--set", "stages.rl.steps=0", "--set",
                 "stages.search.groups=2", "--set", "rollout.max_new_tokens=48"]
    return subprocess.run(args + list(extra), capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_search_run_is_a_normal_run(endpoint, tmp_path):
    r = train(endpoint, tmp_path, "--set", "stages.search.steps=5", "--pause-after", "3")
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "quickstart"
    assert "no learner" in r.stderr
    # Each step is a line of events.log (stderr shows steps only as a terminal's progress line).
    events = (run / "events.log").read_text()
    assert "search step 3/5" in events and "search step 4/5" not in events, events[-3000:]
    # Three rounds of two groups of four (rollout.group_size), each sample kept with its fate; a
    # group in flight at the pause is scored and kept as `paused` (or `unfinished`).
    db = sqlite3.connect(run / "replay.db")
    fates = dict(db.execute("SELECT fate, COUNT(*) FROM samples GROUP BY fate").fetchall())
    assert fates["searched"] == 24 and set(fates) <= {"searched", "paused", "unfinished"}
    # Each sample's prompt is crucible's contrastive prompt, stored as for a local policy.
    prompts = db.execute("SELECT DISTINCT p.text FROM samples s JOIN prompts p ON p.prompt_id = s.prompt_id").fetchall()
    assert prompts and all(("11_matmul_chain_vector" in t or "13_sort_range" in t) and "Performance Analysis" in t
                           for (t,) in prompts)
    # status.json's counters and the store agree, as docs/replay.md says they do.
    status = json.loads(subprocess.run([cli(), "status", str(run), "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    seeds = db.execute("SELECT COUNT(*) FROM variants v LEFT JOIN samples s ON s.variant_id = v.id "
                       "WHERE s.id IS NULL").fetchone()[0]
    assert status["variants"] == 24 + fates.get("paused", 0) + seeds
    # The run's best speedup is its samples' (a seed variant's is the suite's, not the search's).
    best = db.execute("SELECT MAX(v.speedup) FROM variants v JOIN samples s ON s.variant_id = v.id "
                      "WHERE v.status = 'ok' AND v.correct = 1").fetchone()[0]
    assert status["best_speedup"] == (pytest.approx(best) if best is not None else None)
    steps = [json.loads(line) for line in open(run / "metrics.jsonl") if '"train_step"' in line]
    assert [s["stage"] for s in steps] == ["search"] * 3 and all(s["samples"] == 8 for s in steps)
    assert all(s["policy_version"] == 0 for s in steps)
    rep = subprocess.run([cli(), "report", str(run)], capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    assert "learning: search" in rep.stdout + rep.stderr
    # The endpoint's token ids and log-probs are kept with the samples (replay samples shows the text).
    out = tmp_path / "samples.jsonl"
    subprocess.run([cli(), "replay", "samples", str(run), "--out", str(out)], check=True, capture_output=True)
    assert sum(1 for _ in open(out)) == sum(fates.values())

    # Paused after three rounds; the resumed run does the other two, nothing sampled again.
    assert json.loads((run / "status.json").read_text())["state"] == "paused"
    r = train(endpoint, tmp_path, command="resume")
    assert r.returncode == 0, r.stderr[-3000:]
    fates = dict(db.execute("SELECT fate, COUNT(*) FROM samples GROUP BY fate").fetchall())
    assert fates["searched"] == 40 and set(fates) <= {"searched", "paused", "unfinished"}


def test_two_turn_episodes_through_the_endpoint(endpoint, tmp_path):
    """rollout.turns 2 behind the endpoint: each sample's second turn is asked for as chat
    messages (the first prompt, the answer, the feedback on its verdict), and the store keeps every
    turn with its place in its episode."""
    r = train(endpoint, tmp_path, "--set", "stages.search.steps=2", "--set", "rollout.turns=2")
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "quickstart"
    db = sqlite3.connect(run / "replay.db")
    rows = db.execute("SELECT s.group_id, s.episode, s.turn, s.fate, p.text FROM samples s"
                      " JOIN prompts p ON p.prompt_id = s.prompt_id").fetchall()
    searched = [x for x in rows if x[3] == "searched"]
    # Two rounds of two groups of four episodes, two turns each.
    assert len(searched) == 32
    places = {(g, e, t) for g, e, t, _, _ in searched}
    assert len(places) == 32 and {t for _, _, t in places} == {0, 1}
    for g, e, t, _, text in searched:
        if t == 1:
            assert "Turn 1: " in text and "1 more attempts" in text, text[-600:]
    steps = [json.loads(line) for line in open(run / "metrics.jsonl") if '"train_step"' in line]
    assert [[x["samples"] for x in s["turns"]] for s in steps] == [[8, 8], [8, 8]]


def test_wrong_endpoint_model_or_schedule_refused(endpoint, tmp_path):
    r = train(endpoint, tmp_path, "--set", "stages.search.steps=1", "--set", "policy.base_url=http://127.0.0.1:1/v1")
    assert r.returncode == 2 and "policy.base_url" in r.stderr and "cannot reach" in r.stderr, r.stderr[-2000:]
    r = train(endpoint, tmp_path, "--set", "stages.search.steps=1", "--set", "policy.model=gpt-4")
    assert r.returncode == 2 and "'gpt-4' is not served" in r.stderr and "fixed" in r.stderr, r.stderr[-2000:]
    r = train(endpoint, tmp_path, "--set", "stages.search.steps=1", "--set", "stages.rl.steps=3")
    assert r.returncode == 2 and "stages.rl.steps" in r.stderr and "stages.search" in r.stderr, r.stderr[-2000:]
    bad_key = tmp_path / "key"
    bad_key.write_text("not-the-token-at-all\n")
    bad_key.chmod(0o600)
    r = train(endpoint, tmp_path, "--set", "stages.search.steps=1", "--set", f"policy.api_key_file={bad_key}")
    assert r.returncode == 2 and "401" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "quickstart" / "replay.db").exists()
