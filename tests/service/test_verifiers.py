"""A `verifiers` evaluation (verifiers pinned in tools/requirements.txt; its v1 API, the one prime-rl
trains through) of crucible's tasks, with crucible_client.verifiers_env as the environment: the model
at `crucible serve-policy`, the prompts and the rewards from `crucible serve`. Each sample's reward is
the service's verdict of the code in its answer (fetched again by its request id), and the prompt the
model was given is the service's contrastive prompt, exemplars included.

The policy is a Qwen2 of one layer made here with a byte-level BPE tokenizer made here (no
download). Each candidate answer (a fenced block of an env/tasks/cpu/variants file, the reference
renamed ModelNew, code that does not compile, code that crashes, prose with no code) is one token of
its vocabulary. Every layer's weights are 0, so the last hidden state is the last token's embedding:
all tokens but the answers share one embedding, whose logits make the answers about equally likely
and nothing else is; the answers share another, whose logits make <|im_end|> next. So each completion
is one whole candidate and its end, and a few samples of a task get different verdicts.
CRUCIBLE_CLI is the crucible binary (ctest sets it)."""
import asyncio
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python"))

from crucible_client import Client, extract_code  # noqa: E402
from crucible_client.rewards import STATUSES, _request_id  # noqa: E402
from servers import FAST as FAST_EVALUATOR, start_serve, start_serve_policy, token_file  # noqa: E402

SUITE = ROOT / "env" / "tasks" / "cpu"
TOKEN = "verifiers-test-token-0123456789"
POLICY_TOKEN = "verifiers-policy-token-0123456789"
# As test_client.py's FAST, with a failed verdict's reward set apart from 0 (and from the
# format-error reward below), so that a sample given the wrong verdict's reward cannot pass.
SETTINGS = FAST_EVALUATOR + ["--set", "reward.failed=-0.5", "--no-cache"]
FORMAT_ERROR_REWARD = -1.0
TASKS = ["01_relu_scale", "06_rmsnorm"]  # the same answers on two tasks: each row's task decides
ROLLOUTS = 6
MODEL = "tiny-qwen2"
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def candidates():
    """name -> (the model's answer, its status on 01_relu_scale and on 06_rmsnorm; None: either)."""
    relu = SUITE / "variants" / "01_relu_scale"
    reference = (SUITE / "01_relu_scale.py").read_text().replace("class Model(", "class ModelNew(")
    sources = {
        "relu_fast": ((relu / "fast_inplace.py").read_text(), "ok", None),
        "relu_wrong": ((relu / "wrong_clamp_before_shift.py").read_text(), "incorrect", None),
        "relu_reference": (reference, "ok", None),  # the reference's own kernels: 1.00x
        "syntax": ("import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x)\n        return x\n",
                   "compile_error", "compile_error"),
        "relu_crash": (reference.replace("y = x * self.scale", "y = x.view(-1, 3) * self.scale"), "runtime_error",
                       None),
        "rmsnorm_fast": ((SUITE / "variants" / "06_rmsnorm" / "fast_inplace.py").read_text(), None, "ok"),
    }
    out = {name: (f"Here is ModelNew ({name}):\n```python\n{src}```\n", {"01_relu_scale": s1, "06_rmsnorm": s6})
           for name, (src, s1, s6) in sources.items()}
    out["prose"] = ("I would fuse the four passes into one, but I cannot write it.",
                    {"01_relu_scale": "format_error", "06_rmsnorm": "format_error"})
    return out


def tiny_policy(out, answers):
    """Writes to `out` a Qwen2 (safetensors, tokenizer.json, a ChatML template) that answers one of
    `answers` (each a single token), about equally likely, then <|im_end|>, whatever the prompt.
    Returns its tokenizer."""
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # byte-level BPE: the 256 bytes, no merges
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.add_tokens([AddedToken(a, normalized=False) for a in answers])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    ids = tokenizer.convert_tokens_to_ids(answers)
    assert [tokenizer.decode([i]) for i in ids] == answers
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16384,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos,
                         pad_token_id=tokenizer.pad_token_id)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for p in model.model.layers.parameters():
            p.zero_()                          # attention and MLP add nothing: h = the token's embedding
        emb = model.model.embed_tokens.weight
        emb.zero_()
        emb[:, 0] = 1.0                        # any token but an answer: e_0
        emb[ids, 0] = 0.0
        emb[ids, 1] = 1.0                      # an answer: e_1
        model.model.norm.weight.fill_(1.0)     # RMS-normed: 4 e_0 or 4 e_1
        head = model.lm_head.weight
        head.zero_()
        head[:, :2] = -2.0                     # logits -8 for every token, but
        head[ids, 0] = 2.0                     # +8 for the answers after e_0 (e^16 times likelier)
        head[eos, 1] = 2.0                     # +8 for <|im_end|> after an answer
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHATML              # where crucible's tokenizer reads it
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    return tokenizer


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    d = tmp_path_factory.mktemp("verifiers")
    token, policy_token = token_file(d / "token", TOKEN), token_file(d / "policy_token", POLICY_TOKEN)
    cands = candidates()
    tokenizer = tiny_policy(d / "model", [text for text, _ in cands.values()])
    serve, url = start_serve(token, "--device", "cpu", "--suite", str(SUITE), *SETTINGS)
    policy, policy_url = start_serve_policy(d / "model", policy_token, "--served-model-name", MODEL)
    yield {"dir": d, "url": url, "policy_url": policy_url, "tokenizer": tokenizer, "cands": cands}
    for proc in (policy, serve):
        proc.terminate()
    assert policy.wait(timeout=60) == 0 and serve.wait(timeout=60) == 0


def check_samples(traces, client, prompts, tokenizer, cands, id_prefix):
    """Each trace (as verifiers writes it to traces.jsonl): the model was given the service's
    prompt of its task and answered one whole candidate, and its reward, status and metrics are the
    service's verdict of the code in that answer. Returns [(task, candidate name, status, reward)]."""
    import verifiers

    by_answer = {text: name for name, (text, _) in cands.items()}
    samples = []
    for trace in traces:
        assert trace["ok"] and not trace["errors"], trace["errors"]
        assert trace["verifiers"]["version"] == verifiers.__version__
        data = trace["task"]["data"]
        task = data["task"]
        nodes = [n["message"] for n in trace["nodes"]]
        assert [m["role"] for m in nodes] == ["system", "user", "assistant"]
        want = prompts[task]
        # The prompt is the service's contrastive prompt, and it is what serve-policy tokenized.
        assert [{"role": m["role"], "content": m["content"]} for m in nodes[:2]] == want["messages"]
        assert data["exemplars_shown"] == want["exemplars_shown"]
        (call,) = trace["calls"]
        assert call["model"] == MODEL and call["finish_reason"] == "stop"
        rendered = tokenizer.apply_chat_template(want["messages"], add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"]
        assert call["usage"]["prompt_tokens"] == len(rendered)
        answer = nodes[2]["content"]
        assert answer.strip() in {a.strip() for a in by_answer}, f"not one of the candidates: {answer!r}"
        name = next(n for a, n in by_answer.items() if a.strip() == answer.strip())

        info = trace["info"]["crucible"]
        code = extract_code(answer)
        if code is None:
            status, reward = "format_error", FORMAT_ERROR_REWARD
            assert info["id"] is None and info["verdict"] is None
        else:
            assert info["id"] == _request_id(id_prefix, task, code)
            # The request sent again with its id: the service answers the verdict it gave that id, and
            # would refuse (409) an id that came with another task or candidate.
            verdict = client.evaluate(task=task, candidate=code, id=info["id"], timeout_s=10)
            status, reward = verdict["status"], float(verdict["reward"])
            assert info["verdict"] == verdict
        assert (info["task"], info["status"], info["reward"]) == (task, status, reward)
        assert trace["rewards"] == {"crucible": {"score": reward, "weight": 1.0}}
        for s in STATUSES:
            assert trace["metrics"]["crucible/" + s] == (1.0 if s == status else 0.0)
        designed = cands[name][1][task]
        if designed is not None:
            assert status == designed, f"{task}/{name}: {info['verdict'] and info['verdict']['message']}"
        samples.append((task, name, status, reward))
    return samples


def run_in_process(env, policy_url, rollouts):
    """Runs `rollouts` slots of each of the env's tasks in this process, as verifiers' eval runs
    them with --no-serve, the model at `policy_url` (its token in CRUCIBLE_VF_TEST_POLICY).
    Returns the traces as verifiers writes them."""
    import verifiers.v1 as vf
    from verifiers.v1.clients import EvalClientConfig, ModelContext

    ctx = ModelContext(client=EvalClientConfig(base_url=policy_url, api_key_var="CRUCIBLE_VF_TEST_POLICY"),
                       model=MODEL, sampling=vf.SamplingConfig(temperature=1.0, max_tokens=8))

    async def evaluate():
        async with env.serving():
            slots = [slot for task in env.taskset for slot in env.slots(task, rollouts)]
            return await asyncio.gather(*(env.run_slot(slot, ctx) for slot in slots))

    return [t.model_dump(mode="json") for e in asyncio.run(evaluate()) for t in e.traces]


def test_eval_cli_rewards_are_the_service_verdicts(services, tmp_path):
    """`eval crucible-client ...` as a user (or prime-rl's orchestrator, through the same env
    server) runs it: rollouts in verifiers' env-server worker, the model behind its interception."""
    s = services
    client = Client(s["url"], TOKEN)
    relu = SUITE / "variants" / "01_relu_scale"
    exemplars = {"01_relu_scale": [{"code": (relu / "fast_inplace.py").read_text(), "speedup": 2.5},
                                   {"code": (relu / "cpp_fused.py").read_text(), "speedup": 1.5}]}
    (tmp_path / "exemplars.json").write_text(json.dumps(exemplars))
    prompts = {t: client.prompt(task=t, exemplars=exemplars.get(t)) for t in TASKS}
    assert prompts["01_relu_scale"]["exemplars_shown"] == 2

    env = {k: v for k, v in os.environ.items() if k not in ("CRUCIBLE_TOKEN", "PRIME_API_KEY")}
    env.update(HOME=str(tmp_path / "home"), POLICY_TOKEN=POLICY_TOKEN,
               PYTHONPATH=os.pathsep.join([str(ROOT / "clients" / "python"), env.get("PYTHONPATH", "")]))
    args = ["crucible-client", "--model", MODEL, "--client.base-url", s["policy_url"], "--client.api-key-var",
            "POLICY_TOKEN", "--env.taskset.tasks", json.dumps(TASKS), "--env.taskset.exemplars-file",
            str(tmp_path / "exemplars.json"), "--env.taskset.task.service-url", s["url"],
            "--env.taskset.task.token-file", str(s["dir"] / "token"), "--env.taskset.task.format-error-reward",
            str(FORMAT_ERROR_REWARD), "--env.agent.runtime.type", "subprocess", "--num-rollouts", str(ROLLOUTS),
            "--sampling.temperature", "1.0", "--sampling.max-tokens", "8", "--output-dir", str(tmp_path / "out"),
            "--run.name", "crucible", "--no-push", "--no-rich"]
    r = subprocess.run([sys.executable, "-c", "from verifiers.v1.cli.eval.main import main; main()", *args],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    episodes = [json.loads(line) for line in (tmp_path / "out" / "crucible" / "traces.jsonl").read_text().splitlines()]
    assert len(episodes) == len(TASKS) * ROLLOUTS and all(e["ok"] for e in episodes)
    traces = [t for e in episodes for t in e["traces"]]
    assert len(traces) == len(episodes)
    samples = check_samples(traces, client, prompts, s["tokenizer"], s["cands"], "vf-")
    assert sorted(t for t, _, _, _ in samples) == sorted(TASKS * ROLLOUTS)
    statuses = {status for _, _, status, _ in samples}
    assert len(statuses) >= 3, samples
    print("\nsamples (task, answer, status, reward):", json.dumps(sorted(samples), indent=1))


def test_load_environment_in_process(services, monkeypatch):
    """load_environment's Env, run in this process as verifiers' eval runs it with --no-serve."""
    import verifiers.v1 as vf
    from crucible_client.verifiers_env import load_environment

    s = services
    client = Client(s["url"], TOKEN)
    monkeypatch.delenv("CRUCIBLE_VF_TEST_TOKEN", raising=False)  # load_environment sets it; undone after
    monkeypatch.setenv("CRUCIBLE_VF_TEST_POLICY", POLICY_TOKEN)
    exemplar = [{"code": (SUITE / "variants" / "06_rmsnorm" / "cpp_fused.py").read_text(), "speedup": 1.7}]
    env = load_environment(s["url"], TOKEN, tasks=["06_rmsnorm"], exemplars=exemplar, token_var="CRUCIBLE_VF_TEST_TOKEN",
                           format_error_reward=FORMAT_ERROR_REWARD, id_prefix="vf-py-")
    assert isinstance(env, vf.SingleAgentEnv)
    assert TOKEN not in env.config.model_dump_json()  # the token stays out of the config a run saves
    prompts = {"06_rmsnorm": client.prompt(task="06_rmsnorm", exemplars=exemplar)}
    assert prompts["06_rmsnorm"]["exemplars_shown"] == 1

    traces = run_in_process(env, s["policy_url"], 4)
    assert len(traces) == 4
    samples = check_samples(traces, client, prompts, s["tokenizer"], s["cands"], "vf-py-")
    print("\nsamples (task, answer, status, reward):", json.dumps(sorted(samples), indent=1))


def test_multi_turn_episodes_in_process(services, monkeypatch):
    """turns=2: after an answer with code, the harness has it judged and asks the service for the
    next turn's messages (the answer, then the feedback on its verdict); the reward is the best
    turn's verdict, each turn judged once under the reward's id."""
    from crucible_client.verifiers_env import load_environment

    s = services
    client = Client(s["url"], TOKEN)
    monkeypatch.delenv("CRUCIBLE_VF_TEST_TOKEN", raising=False)
    monkeypatch.setenv("CRUCIBLE_VF_TEST_POLICY", POLICY_TOKEN)
    env = load_environment(s["url"], TOKEN, tasks=["01_relu_scale"], token_var="CRUCIBLE_VF_TEST_TOKEN",
                           format_error_reward=FORMAT_ERROR_REWARD, id_prefix="vf-mt-", turns=2)
    assert TOKEN not in env.config.model_dump_json()
    first = client.prompt(task="01_relu_scale")
    traces = run_in_process(env, s["policy_url"], 6)
    assert len(traces) == 6
    two_turns = 0
    for trace in traces:
        assert trace["ok"] and not trace["errors"], trace["errors"]
        nodes = [n["message"] for n in trace["nodes"]]
        answers = [m["content"] for m in nodes if m["role"] == "assistant"]
        assert [{"role": m["role"], "content": m["content"]} for m in nodes[:2]] == first["messages"]
        info = trace["info"]["crucible"]
        judged = []
        for a in answers:
            code = extract_code(a)
            if code is None:
                judged.append(("format_error", FORMAT_ERROR_REWARD))
                continue
            v = client.evaluate(task="01_relu_scale", candidate=code, id=_request_id("vf-mt-", "01_relu_scale", code),
                                timeout_s=10)
            judged.append((v["status"], float(v["reward"])))
        assert [(t["status"], t["reward"]) for t in info["turns"]] == judged
        if extract_code(answers[0]) is None:
            assert len(answers) == 1  # no code: the episode ends
            continue
        assert len(answers) == 2
        two_turns += 1
        # The second turn's prompt: the first answer, then the service's feedback on its verdict.
        roles = [m["role"] for m in nodes]
        assert roles == ["system", "user", "assistant", "user", "assistant"]
        assert nodes[3]["content"].startswith("Turn 1: ") and "1 more attempts" in nodes[3]["content"]
        best = max(r for _, r in judged)
        assert trace["rewards"]["crucible"]["score"] == best and info["reward"] == best
    assert two_turns >= 1
