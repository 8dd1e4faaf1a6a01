"""crucible as an OpenEnv environment (openenv-core pinned in tools/requirements.txt;
crucible_client.openenv_env): the server beside a real `crucible serve`, reached through openenv's
own client (its WebSocket sessions). An episode's prompt is the service's, each step's reward and
verdict are the service's for that code (read back by its request id, and equal to `crucible
eval`'s from the service's verdict cache), a second turn's messages carry the service's feedback,
an answer without code ends the episode. Then TRL's GRPOTrainer with a rollout function over the
OpenEnv client, its samples from `crucible serve-policy` (the tiny model of test_verifiers.py that
answers whole candidates): every reward TRL logs is the environment's step reward.
CRUCIBLE_CLI is the crucible binary (ctest sets it)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python"))

from crucible_client import Client  # noqa: E402
from crucible_client.openenv_env import KernelAction, KernelEnv  # noqa: E402
from servers import FAST as FAST_EVALUATOR  # noqa: E402
from servers import crucible_cli, start, start_serve, start_serve_policy, token_file  # noqa: E402
from test_verifiers import candidates, tiny_policy  # noqa: E402

SUITE = ROOT / "env" / "tasks" / "cpu"
TOKEN = "openenv-test-token-0123456789"
POLICY_TOKEN = "openenv-policy-token-0123456789"
SETTINGS = FAST_EVALUATOR + ["--set", "reward.failed=-0.5"]
FORMAT_ERROR_REWARD = -1.0
TASKS = ["01_relu_scale", "06_rmsnorm"]


def start_openenv(service_url, token, *extra):
    # The package from the checkout, as the tests import it (PYTHONPATH reaches the server's process).
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "clients" / "python"), os.environ.get("PYTHONPATH")) if p)
    args = [sys.executable, "-m", "crucible_client.openenv_env", "--service-url", service_url, "--token-file",
            str(token), "--listen", "127.0.0.1:0", "--format-error-reward", str(FORMAT_ERROR_REWARD), *extra]
    return start(args, r"listening on (http://127\.0\.0\.1:\d+)", str(token) + ".openenv.err")


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    d = tmp_path_factory.mktemp("openenv")
    token = token_file(d / "token", TOKEN)
    cache = d / "verdicts.db"
    serve, url = start_serve(token, "--device", "cpu", "--suite", str(SUITE), *SETTINGS,
                             "--set", f"evaluator.cache={cache}")
    env_proc, env_url = start_openenv(url, token, "--turns", "2", "--tasks", ",".join(TASKS))
    yield {"dir": d, "url": url, "env_url": env_url, "cache": cache, "client": Client(url, TOKEN)}
    env_proc.terminate()
    serve.terminate()
    assert env_proc.wait(timeout=60) == 0 and serve.wait(timeout=60) == 0


def answer(path_or_text):
    src = path_or_text.read_text() if isinstance(path_or_text, pathlib.Path) else path_or_text
    return f"Here is my kernel:\n```python\n{src}```\n"


def cli_verdict(path, task, cache):
    r = subprocess.run([crucible_cli(), "eval", "--task", str(SUITE / f"{task}.py"), "--candidate", str(path),
                        "--device", "cpu", "--json", *SETTINGS, "--set", f"evaluator.cache={cache}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_an_episode_of_two_turns_through_the_openenv_client(services):
    client = services["client"]
    fast = SUITE / "variants" / "01_relu_scale" / "fast_inplace.py"
    wrong = SUITE / "variants" / "01_relu_scale" / "wrong_clamp_before_shift.py"
    with KernelEnv(base_url=services["env_url"], message_timeout_s=600).sync() as env:
        r = env.reset(task="01_relu_scale")
        assert not r.done and r.reward is None
        assert r.observation.task == "01_relu_scale" and r.observation.turn == 1 and r.observation.turns_total == 2
        assert r.observation.messages == client.prompt(task="01_relu_scale")["messages"]

        r = env.step(KernelAction(response=answer(fast)))
        assert not r.done
        first = r.observation
        assert first.status == "ok" and r.reward == first.verdict["reward"]
        assert client.result(first.evaluation_id, timeout_s=10) == first.verdict  # the service's own verdict
        # The next turn: the answer and the service's feedback on its verdict after the first prompt.
        assert first.turn == 2 and len(first.messages) == 4
        assert [m["role"] for m in first.messages] == ["system", "user", "assistant", "user"]
        assert first.messages[2]["content"] == answer(fast)

        r = env.step(KernelAction(response=answer(wrong)))
        assert r.done and r.observation.status == "incorrect" and r.reward == -0.5
        st = env.state()
        assert st.task == "01_relu_scale" and [t["status"] for t in st.turns] == ["ok", "incorrect"]

        # The same code through `crucible eval`, read back from the service's verdict cache.
        for path, v in ((fast, first.verdict), (wrong, r.observation.verdict)):
            cli = cli_verdict(path, "01_relu_scale", services["cache"])
            assert (cli["status"], cli["reward"]) == (v["status"], v["reward"])

        # An episode over takes no step; a new one does. An answer without code ends it.
        with pytest.raises(Exception, match="reset"):
            env.step(KernelAction(response=answer(fast)))
        r = env.reset(seed=5)
        assert r.observation.task in TASKS
        r = env.step(KernelAction(response="I cannot write this one."))
        assert r.done and r.observation.status == "format_error" and r.reward == FORMAT_ERROR_REWARD


def test_trl_rollouts_through_the_openenv_client_with_samples_from_serve_policy(services, tmp_path):
    import openai
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from transformers import AutoModelForCausalLM

    cands = candidates()
    tokenizer = tiny_policy(tmp_path / "model", [text for text, _ in cands.values()])
    policy_token = token_file(tmp_path / "policy_token", POLICY_TOKEN)
    policy, policy_url = start_serve_policy(tmp_path / "model", policy_token, "--served-model-name", "tiny")
    try:
        sampler = openai.OpenAI(base_url=policy_url, api_key=POLICY_TOKEN, max_retries=0)
        steps = []  # per rollout: (task, the answer, the environment's reward, its status)

        def rollout_func(prompts, trainer):
            out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_reward": []}
            # TRL hands each prompt once per generation of its group (trl 1.16): one episode each.
            for task in prompts:
                with KernelEnv(base_url=services["env_url"], message_timeout_s=600).sync() as env:
                    obs = env.reset(task=task).observation
                    r = sampler.chat.completions.create(model="tiny", messages=obs.messages, max_tokens=4,
                                                        temperature=1.0, logprobs=True,
                                                        extra_body={"return_token_ids": True})
                    text = r.choices[0].message.content
                    step = env.step(KernelAction(response=text))
                steps.append((task, text, step.reward, step.observation.status))
                out["prompt_ids"].append(r.model_extra["prompt_token_ids"])
                out["completion_ids"].append(r.choices[0].model_extra["token_ids"])
                out["logprobs"].append([t.logprob for t in r.choices[0].logprobs.content])
                out["env_reward"].append(step.reward)
            return out

        def env_reward(completions, env_reward, **kwargs):
            return list(env_reward)

        dataset = Dataset.from_dict({"prompt": TASKS * 2})
        args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, max_steps=2,
                          per_device_train_batch_size=4, num_generations=4, learning_rate=1e-6, logging_steps=1,
                          report_to="none", save_strategy="no", disable_tqdm=True, seed=0)
        trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tmp_path / "model"), processing_class=tokenizer,
                              reward_funcs=[env_reward], train_dataset=dataset, args=args, rollout_func=rollout_func)
        trainer.train()
    finally:
        policy.terminate()
        assert policy.wait(timeout=60) == 0

    assert len(steps) == 8  # two steps of one prompt's four generations
    statuses = {s for _, _, _, s in steps}
    assert statuses - {"format_error"}, "the tiny model's answers reached the evaluator"
    for task, text, reward, status in steps:
        expected = next(want[task] for t, want in cands.values() if t == text)
        if expected is not None:
            assert status == expected, (task, text[:40])
    logged = [e["reward"] for e in trainer.state.log_history if "reward" in e]
    mean = [sum(r for _, _, r, _ in steps[i * 4:(i + 1) * 4]) / 4 for i in range(2)]
    assert logged == pytest.approx(mean)
