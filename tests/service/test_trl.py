"""A real TRL GRPOTrainer run (trl pinned in tools/requirements.txt) takes its rewards from a running
`crucible serve`, and the rewards it logs equal `crucible eval`'s verdicts for the same samples.

The policy is a tiny GPT-2 made here with a tokenizer made here (no download). Each candidate
answer (a fenced block of an env/tasks/cpu/variants file, the reference renamed ModelNew, code that
does not compile, code that crashes, prose with no code) is one token of the vocabulary, and the
model's final layer norm has weight 0, so its logits are its bias against the tied embeddings: set
so that those tokens are about equally likely and nothing else is. With max_completion_length=1
each completion is one whole candidate, and a group of 4 gets different verdicts. CRUCIBLE_CLI is
the crucible binary (ctest sets it)."""
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python"))

from crucible_client import Client, trl_reward  # noqa: E402
from crucible_client.rewards import STATUSES, _request_id  # noqa: E402
from servers import FAST as FAST_EVALUATOR, crucible_cli, start_serve, token_file  # noqa: E402

SUITE = ROOT / "env" / "tasks" / "cpu"
VARIANTS = SUITE / "variants" / "01_relu_scale"
TOKEN = "trl-test-token-0123456789abcdef"
# As test_client.py's FAST, with a failed verdict's reward set apart from 0 (and from the
# format-error reward below), so that a sample given the wrong verdict's reward cannot pass.
SETTINGS = FAST_EVALUATOR + ["--set", "reward.failed=-0.5"]
FORMAT_ERROR_REWARD = -1.0
TASKS = ["01_relu_scale", "06_rmsnorm"]  # the same answers on two tasks: the `task` column decides
STEPS = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cli = crucible_cli()
    d = tmp_path_factory.mktemp("serve")
    token = token_file(d / "token", TOKEN)
    # The service's verdict cache, which the CLI reads back below: a timing measured twice differs
    # by noise (on a loaded 2-core machine by more than its band), a verdict read back does not.
    cache = d / "verdicts.db"
    proc, url = start_serve(token, "--device", "cpu", "--suite", str(SUITE), *SETTINGS,
                            "--set", f"evaluator.cache={cache}")
    yield cli, url, cache
    proc.terminate()
    assert proc.wait(timeout=60) == 0


def candidates(tmp):
    """name -> (the completion, the file `crucible eval` judges (None: no code), its status on
    01_relu_scale)."""
    reference = (SUITE / "01_relu_scale.py").read_text().replace("class Model(", "class ModelNew(")
    files = {
        "fast": (VARIANTS / "fast_inplace.py", "ok"),
        "wrong": (VARIANTS / "wrong_clamp_before_shift.py", "incorrect"),
        "reference": (reference, "ok"),  # the reference's own kernels: no speed credit, 1.00x
        "syntax": ("import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x)\n        return x\n",
                   "compile_error"),
        "crash": (reference.replace("y = x * self.scale", "y = x.view(-1, 3) * self.scale"), "runtime_error"),
    }
    out = {}
    for name, (src, status) in files.items():
        if not isinstance(src, pathlib.Path):
            (tmp / f"{name}.py").write_text(src)
            src = tmp / f"{name}.py"
        out[name] = (f"Here is ModelNew ({name}):\n```python\n{src.read_text()}```\n", src, status)
    out["prose"] = ("I would fuse the four passes into one, but I cannot write it.", None, "format_error")
    return out


def tiny_policy(answers):
    """A GPT-2 of one layer whose next token is one of `answers` (each a single token), about
    equally likely, whatever the prompt."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>", "write", "a", "faster", "ModelNew", "for", *TASKS]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<pad>", "<eos>", "<unk>"])
    tok.add_tokens(answers)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    answer_ids = tokenizer.convert_tokens_to_ids(answers)
    assert [tokenizer.decode([i]) for i in answer_ids] == answers

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=32, n_embd=16, n_layer=1, n_head=2,
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()       # the last hidden state is ln_f's bias alone,
        model.transformer.ln_f.bias.zero_()
        model.transformer.ln_f.bias[0] = 1.0        # e_0, so a token's logit is its embedding's dim 0
        wte = model.transformer.wte.weight
        wte[:, 0] = -8.0
        wte[answer_ids, 0] = 8.0                    # answers e^16 times likelier than any other token
    return model, tokenizer


def cli_verdict(cli, task, path, cache=None):
    """`crucible eval`'s verdict: measured afresh, or read from the verdict cache `cache`."""
    where = ["--set", f"evaluator.cache={cache}"] if cache else ["--no-cache"]
    r = subprocess.run([cli, "eval", "--task", str(SUITE / f"{task}.py"), "--candidate", str(path), "--device", "cpu",
                        "--json", *SETTINGS, *where], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_grpo_trainer_rewards_are_the_cli_verdicts(server, tmp_path):
    import pandas as pd
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    cli, url, cache = server
    client = Client(url, TOKEN)
    cands = candidates(tmp_path)
    by_completion = {text: name for name, (text, _, _) in cands.items()}
    model, tokenizer = tiny_policy([text for text, _, _ in cands.values()])

    # The reward TRL calls is trl_reward's, recorded on the way through.
    crucible = trl_reward(client, format_error_reward=FORMAT_ERROR_REWARD)
    calls = []

    def crucible_reward(prompts, completions, **kwargs):
        rewards = crucible(prompts=prompts, completions=completions, **kwargs)
        calls.append({"completions": list(completions), "tasks": list(kwargs["task"]), "rewards": list(rewards),
                      "completion_ids": kwargs.get("completion_ids")})
        return rewards

    dataset = Dataset.from_dict({"prompt": [f"write a faster ModelNew for {t}" for t in TASKS] * 2,
                                 "task": TASKS * 2})
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, gradient_checkpointing=False,
                      max_steps=STEPS, per_device_train_batch_size=8, num_generations=4, max_completion_length=1,
                      learning_rate=1e-6, logging_steps=1, log_completions=True, num_completions_to_print=0,
                      report_to="none", save_strategy="no", disable_tqdm=True, seed=0)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[crucible_reward],
                          train_dataset=dataset, args=args)
    trainer.train()

    # One reward call a step, 2 prompts x 4 generations, each completion one whole candidate.
    assert len(calls) == STEPS
    samples = []  # (step, task, candidate name, reward)
    for step, call in enumerate(calls, 1):
        assert len(call["completions"]) == 8 and all(len(ids) == 1 for ids in call["completion_ids"])
        for completion, task, reward in zip(call["completions"], call["tasks"], call["rewards"]):
            assert completion in by_completion, f"not one of the candidates: {completion!r}"
            samples.append((step, task, by_completion[completion], reward))
    assert {t for _, t, _, _ in samples} == set(TASKS), "both tasks' rows were sampled"

    # What TRL logged: per sample (the completions table, with the status trl_reward logs beside
    # it) and per step (rewards/crucible_reward/mean, crucible/<status>).
    service = {}  # (task, name) -> the service's verdict, by the request id trl_reward gave it
    for task, name in {(t, n) for _, t, n, _ in samples if cands[n][1] is not None}:
        code = cands[name][1].read_text()
        service[(task, name)] = client.result(_request_id("trl-", task, code), timeout_s=10)
    logs = {e["step"]: e for e in trainer.state.log_history if "rewards/crucible_reward/mean" in e}
    assert sorted(logs) == list(range(1, STEPS + 1))
    groups_with_spread = 0
    for step, call in enumerate(calls, 1):
        table = pd.read_parquet(tmp_path / "out" / "completions" / f"completions_{step:05d}.parquet")
        assert list(table["completion"]) == call["completions"]
        logged = list(table["crucible_reward"])
        assert logged == [torch.tensor(r, dtype=torch.float32).item() for r in call["rewards"]]
        statuses = [service[(t, by_completion[c])]["status"] if cands[by_completion[c]][1] else "format_error"
                    for c, t in zip(call["completions"], call["tasks"])]
        assert list(table["crucible_status"]) == statuses
        rewards32 = torch.tensor(call["rewards"], dtype=torch.float32)
        assert logs[step]["rewards/crucible_reward/mean"] == pytest.approx(rewards32.mean().item(), rel=1e-6, abs=1e-6)
        for status in STATUSES:
            assert logs[step]["crucible/" + status] == pytest.approx(statuses.count(status) / len(statuses))
        groups_with_spread += sum(len(set(call["rewards"][g:g + 4])) > 1 for g in range(0, 8, 4))
    assert groups_with_spread > 0, "every group's rewards were equal: no advantage, nothing tested"

    # Every reward is its service verdict's (exactly), and that verdict is the CLI's for the same
    # sample: measured afresh by the CLI, the same status, and the same reward where no timing
    # enters it; read by the CLI from the verdict cache the service wrote, the same verdict, reward
    # and speedup included (a timing measured twice differs by noise). The 01_relu_scale candidates
    # are all judged by the CLI, seen or not, so that the construction is known to give the statuses
    # it means to.
    for _, task, name, reward in samples:
        assert reward == (float(service[(task, name)]["reward"]) if cands[name][1] else FORMAT_ERROR_REWARD)
    pairs = sorted(set(service) | {("01_relu_scale", n) for n, c in cands.items() if c[1] is not None})
    seen = {}
    for task, name in pairs:
        v = cli_verdict(cli, task, cands[name][1])
        if task == "01_relu_scale":
            assert v["status"] == cands[name][2], f"{name}: {v['message']}"
        if (task, name) not in service:
            continue
        s = service[(task, name)]
        assert s["status"] == v["status"], f"{task}/{name}: service {s['message']!r}, CLI {v['message']!r}"
        if v["status"] != "ok":
            assert s["reward"] == v["reward"] == -0.5, f"{task}/{name}"
        kept = cli_verdict(cli, task, cands[name][1], cache)
        assert kept["cache_hit"] and kept["status"] == s["status"], f"{task}/{name}"
        assert kept["reward"] == s["reward"] and kept.get("speedup") == s.get("speedup"), f"{task}/{name}"
        seen.setdefault(v["status"], []).append(f"{task}/{name}: {s['reward']} vs CLI {v['reward']}" +
                                                (f" (bands ±{s['speedup_spread']:.0%}, ±{v['speedup_spread']:.0%})"
                                                 if v["status"] == "ok" else ""))
    print("\nverdicts of the samples, service vs CLI:", json.dumps(seen, indent=1))
    assert len(seen) >= 3, seen
