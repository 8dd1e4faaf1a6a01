"""clients/python (crucible_client) against a real `crucible serve` on loopback, on the CPU: the
client's verdicts, TRL's reward-function calling convention, verl's compute_score, and the
errors a trainer sees. CRUCIBLE_CLI is the crucible binary (ctest sets it)."""
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python"))

from crucible_client import Client, ServiceError, extract_code, trl_reward, verl_compute_score  # noqa: E402
from servers import FAST as FAST_EVALUATOR, start_serve, token_file  # noqa: E402

SUITE = ROOT / "env" / "tasks" / "cpu"
TOKEN = "client-test-token-0123456789"
FAST = FAST_EVALUATOR + ["--no-cache"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    token = token_file(tmp_path_factory.mktemp("serve") / "token", TOKEN)
    proc, url = start_serve(token, "--device", "cpu", "--suite", str(SUITE), *FAST)
    yield url
    proc.terminate()
    assert proc.wait(timeout=60) == 0


def variant(task, name):
    return (SUITE / "variants" / task / name).read_text()


def test_verdicts_and_errors(server):
    client = Client(server, TOKEN)
    assert client.health()["devices"] == ["cpu"]
    assert "01_relu_scale" in client.tasks()
    v = client.evaluate(task="01_relu_scale", candidate=variant("01_relu_scale", "fast_inplace.py"))
    assert v["status"] == "ok" and v["reward"] > 0
    v = client.evaluate(task_source=(SUITE / "01_relu_scale.py").read_text(),
                        candidate=variant("01_relu_scale", "wrong_clamp_before_shift.py"))
    assert v["status"] == "incorrect"
    with pytest.raises(ServiceError) as e:
        client.evaluate(task="no_such_task", candidate="x")
    assert e.value.status == 404 and "no task 'no_such_task'" in e.value.message
    with pytest.raises(ServiceError) as e:
        Client(server, "not-the-token-at-all").health()
    assert e.value.status == 401
    with pytest.raises(ServiceError) as e:
        Client("http://127.0.0.1:1", TOKEN).health()
    assert e.value.status == 0 and "cannot reach" in e.value.message


def test_contrastive_prompt(server):
    client = Client(server, TOKEN)
    fast = variant("01_relu_scale", "fast_inplace.py")
    p = client.prompt(task="01_relu_scale", exemplars=[{"code": fast, "speedup": 2.5}, {"code": "class ModelNew: pass",
                                                                                         "speedup": 0.5}])
    assert [m["role"] for m in p["messages"]] == ["system", "user"]
    assert p["exemplars_shown"] == 2
    user = p["user"]
    assert "01_relu_scale" in user and "class Model(nn.Module)" in user
    # Shown by increasing speedup, as crucible's own prompts show them.
    assert user.index("speedup 0.50x") < user.index("speedup 2.50x") and fast.strip() in user
    bare = client.prompt(task_source=(SUITE / "01_relu_scale.py").read_text())
    assert bare["exemplars_shown"] == 0
    with pytest.raises(ServiceError) as e:
        client.prompt(task="01_relu_scale", exemplars=[{"code": "x", "speedup": -1}])
    assert e.value.status == 400 and "exemplars[0]" in e.value.message


def test_multi_turn_prompt(server):
    """A second turn: the first answer judged under an id, then the prompt that goes on with the
    answer and the feedback on its verdict (prompt.feedback_template)."""
    client = Client(server, TOKEN)
    wrong = variant("01_relu_scale", "wrong_clamp_before_shift.py")
    answer = "## Approach\nClamp first.\n\n```python\n" + wrong + "\n```\n"
    v = client.evaluate(task="01_relu_scale", candidate=wrong, id="episode-1-turn-1")
    assert v["status"] == "incorrect"
    p = client.prompt(task="01_relu_scale", turns=[{"answer": answer, "evaluation": "episode-1-turn-1"}],
                      turns_total=3)
    assert [m["role"] for m in p["messages"]] == ["system", "user", "assistant", "user"]
    assert p["turn"] == 2
    assert p["messages"][2]["content"] == answer
    feedback = p["messages"][3]["content"]
    assert feedback.startswith("Turn 1: incorrect.") and "2 more attempts" in feedback
    assert v["message"][:60] in feedback  # the evaluator's message, cut to max_error_chars
    # A correct turn's feedback shows where its time went: the candidate's own profile.
    fast = variant("01_relu_scale", "fast_inplace.py")
    v = client.evaluate(task="01_relu_scale", candidate=fast, id="episode-2-turn-1")
    assert v["status"] == "ok" and v["profile"] and 0 <= v["own_share"] <= 1
    assert all(0 <= k["share"] <= 1 for k in v["profile"]) and sum(k["share"] for k in v["profile"]) <= 1 + 1e-9
    p = client.prompt(task="01_relu_scale", turns=[{"answer": "```python\n" + fast + "```", "evaluation": "episode-2-turn-1"}])
    feedback = p["messages"][3]["content"]
    assert "Where its time went" in feedback and v["profile"][0]["name"] in feedback
    # Errors name what is wrong.
    with pytest.raises(ServiceError) as e:
        client.prompt(task="01_relu_scale", turns=[{"answer": answer, "evaluation": "never-sent"}])
    assert e.value.status == 404 and "never-sent" in e.value.message
    with pytest.raises(ServiceError) as e:
        client.prompt(task="02_silu_bias_residual", turns=[{"answer": answer, "evaluation": "episode-1-turn-1"}])
    assert e.value.status == 400 and "judged task '01_relu_scale'" in e.value.message
    with pytest.raises(ServiceError) as e:
        client.prompt(task="01_relu_scale", turns=[{"answer": answer, "evaluation": "episode-1-turn-1"}],
                      turns_total=1)
    assert e.value.status == 400 and "turns_total" in e.value.message
    with pytest.raises(ServiceError) as e:
        client.prompt(task="01_relu_scale", turns=[{"answer": 3}])
    assert e.value.status == 400 and "turns[0]" in e.value.message


def test_trl_reward_function(server):
    """The call GRPOTrainer makes: reward_func(prompts=..., completions=..., **dataset columns)."""
    reward = trl_reward(Client(server, TOKEN))
    fast = "Here it is:\n```python\n" + variant("01_relu_scale", "fast_inplace.py") + "```\n"
    wrong = [{"role": "assistant", "content": "```python\n" + variant("01_relu_scale", "wrong_clamp_before_shift.py") + "```"}]
    rewards = reward(prompts=["p0", "p1", "p2"], completions=[fast, wrong, "no code here"],
                     task=["01_relu_scale", "01_relu_scale", "01_relu_scale"])
    assert len(rewards) == 3
    assert rewards[0] > 0          # correct and judged
    assert rewards[1] == 0.0       # incorrect: the verdict's reward
    assert rewards[2] == 0.0       # no code: format error
    with pytest.raises(ValueError, match="no column 'task'"):
        reward(prompts=["p"], completions=[fast])


def test_verl_compute_score(server):
    score = verl_compute_score(Client(server, TOKEN))
    assert score("crucible", "```python\n" + variant("01_relu_scale", "fast_inplace.py") + "```", "01_relu_scale") > 0
    assert score("crucible", "nothing", "01_relu_scale") == 0.0


def test_many_clients_each_request_judged_once(server):
    # Eight clients at once: four candidates, each sent by two clients under the same id. Every
    # client gets its verdict, the two of an id the same one, and the service judges four.
    import concurrent.futures
    import urllib.request

    def judged_total():
        req = urllib.request.Request(server + "/v1/metrics", headers={"Authorization": "Bearer " + TOKEN})
        text = urllib.request.urlopen(req).read().decode()
        return int(float(re.search(r"^crucible_serve_judged_total (\S+)$", text, re.M).group(1)))

    names = ["fast_inplace.py", "wrong_clamp_before_shift.py"]
    jobs = [(f"many-{k}-{name}", name) for k in range(2) for name in names] * 2
    before = judged_total()
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        verdicts = list(pool.map(lambda job: Client(server, TOKEN).evaluate(
            task="01_relu_scale", candidate=variant("01_relu_scale", job[1]), id=job[0]), jobs))
    assert judged_total() - before == 4
    by_id = {}
    for (rid, name), v in zip(jobs, verdicts):
        assert v["status"] == ("ok" if name.startswith("fast") else "incorrect")
        by_id.setdefault(rid, []).append(v)
    assert all(a == b for a, b in by_id.values())


def test_extract_code():
    assert extract_code("```python\nclass ModelNew: pass\n```") == "class ModelNew: pass\n"
    assert extract_code("a\n```\nx = 1\n```\n```py\nclass ModelNew: pass\n```\n") == "class ModelNew: pass\n"
    assert extract_code("class ModelNew: pass") == "class ModelNew: pass"
    assert extract_code("no code") is None
