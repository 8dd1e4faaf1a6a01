"""`crucible serve-policy` on loopback, on the CPU, through the official `openai` client unchanged:
completions and chat completions, streaming, n samples, seeds, stop strings and log-probs, checked
against `crucible generate` on the same model; and the errors a client sees (wrong token, unknown
model, unsupported parameters, malformed JSON, a full queue, a client that goes away).
CRUCIBLE_CLI is the crucible binary (ctest sets it)."""
import concurrent.futures
import json
import subprocess
import urllib.error
import urllib.request

import openai
import pytest

from servers import crucible_cli as cli, start_serve_policy, tiny_model, token_file

TOKEN = "policy-test-token-0123456789"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("policy")
    tiny_model(d)
    token_file(d / "token", TOKEN)
    return d


def start(model_dir, *extra):
    return start_serve_policy(model_dir / "model", model_dir / "token", *extra)


@pytest.fixture(scope="module")
def server(model_dir):
    proc, url = start(model_dir)
    yield url
    proc.terminate()
    assert proc.wait(timeout=60) == 0


def client(url, **kw):
    return openai.OpenAI(base_url=url, api_key=TOKEN, max_retries=0, **kw)


def generate(model_dir, prompt, *args):
    out = subprocess.run([cli(), "generate", "--model", str(model_dir / "model"), "--prompt", prompt, "--json", *args],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def test_completions_match_the_engine(server, model_dir):
    c = client(server)
    assert [m.id for m in c.models.list().data] == ["model"]
    prompt = "The engine samples completions"
    r = c.completions.create(model="model", prompt=prompt, max_tokens=12, temperature=0, logprobs=0,
                             extra_body={"return_token_ids": True})
    want = generate(model_dir, prompt, "--temperature", "0", "--max-new-tokens", "12")
    got = r.choices[0]
    assert got.text == want["completions"][0]["text"]
    assert got.model_extra["token_ids"] == want["completions"][0]["token_ids"]
    assert r.model_extra["prompt_token_ids"] == want["prompt_token_ids"]
    assert got.logprobs.token_logprobs == pytest.approx(want["completions"][0]["logprobs"], abs=1e-5)
    assert got.finish_reason == "length"
    assert r.usage.prompt_tokens == len(want["prompt_token_ids"]) and r.usage.completion_tokens == 12

    # Token-id prompts, several prompts, n samples: choices ordered prompt by prompt.
    ids = want["prompt_token_ids"]
    r = c.completions.create(model="model", prompt=[ids, ids[:4]], max_tokens=5, n=3, temperature=1.0, seed=7)
    assert sorted(ch.index for ch in r.choices) == list(range(6))
    again = c.completions.create(model="model", prompt=[ids, ids[:4]], max_tokens=5, n=3, temperature=1.0, seed=7)
    assert [ch.text for ch in r.choices] == [ch.text for ch in again.choices]  # a seed reproduces

    # A stop string cuts the text before it.
    full = c.completions.create(model="model", prompt=prompt, max_tokens=20, temperature=0).choices[0].text
    stop = full[6:9]
    cut = c.completions.create(model="model", prompt=prompt, max_tokens=20, temperature=0, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop" and cut.text == full[:full.index(stop)]


def test_chat_and_streaming(server):
    c = client(server)
    msgs = [{"role": "system", "content": "You write kernels."}, {"role": "user", "content": "Write a fast relu."}]
    r = c.chat.completions.create(model="model", messages=msgs, max_tokens=16, n=2, temperature=1.0, seed=3,
                                  logprobs=True)
    assert len(r.choices) == 2
    for ch in r.choices:
        assert ch.message.role == "assistant"
        assert all(t.logprob <= 0 for t in ch.logprobs.content)
    assert sum(len(ch.logprobs.content) for ch in r.choices) == r.usage.completion_tokens
    # The stream of the same seeded request carries the same text and log-probs, piece by piece.
    stream = c.chat.completions.create(model="model", messages=msgs, max_tokens=16, n=2, temperature=1.0, seed=3,
                                       logprobs=True, stream=True, stream_options={"include_usage": True})
    text, lps, finish, usage, chunks = ["", ""], [[], []], [None, None], None, 0
    for chunk in stream:
        chunks += 1
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            text[ch.index] += ch.delta.content or ""
            if ch.logprobs and ch.logprobs.content:
                lps[ch.index] += [t.logprob for t in ch.logprobs.content]
            finish[ch.index] = ch.finish_reason or finish[ch.index]
    assert chunks > 3  # streamed, not one answer
    assert text == [ch.message.content for ch in r.choices]
    assert lps == [[t.logprob for t in ch.logprobs.content] for ch in r.choices]
    assert finish == [ch.finish_reason for ch in r.choices]
    assert usage.completion_tokens == r.usage.completion_tokens


def test_a_model_trained_on_plain_prompts_is_served_without_a_chat_template(model_dir, tmp_path):
    # A checkpoint of a run with prompt.chat_template none carries crucible_prompt.json saying so
    # (the run writes it beside every checkpoint's weights): its chat requests are the plain text
    # the run trained on, the contents by blank lines, not the tokenizer's chat template.
    import shutil
    plain = tmp_path / "plain"
    shutil.copytree(model_dir / "model", plain)
    (plain / "crucible_prompt.json").write_text('{"chat_template": "none"}\n')
    proc, url = start_serve_policy(plain, model_dir / "token")
    try:
        c = client(url)
        msgs = [{"role": "system", "content": "You write kernels."}, {"role": "user", "content": "Write a fast relu."}]
        chat = c.chat.completions.create(model="plain", messages=msgs, max_tokens=12, temperature=0)
        text = c.completions.create(model="plain", prompt="You write kernels.\n\nWrite a fast relu.", max_tokens=12,
                                    temperature=0)
        assert chat.choices[0].message.content == text.choices[0].text
        assert chat.usage.prompt_tokens == text.usage.prompt_tokens
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    # The same model with its template (--chat-template auto overrides the file): another prompt.
    proc, url = start_serve_policy(plain, model_dir / "token", "--chat-template", "auto")
    try:
        templated = client(url).chat.completions.create(model="plain", messages=msgs, max_tokens=12, temperature=0)
        assert templated.usage.prompt_tokens != chat.usage.prompt_tokens
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    # A file that says something else is refused at start, naming it.
    (plain / "crucible_prompt.json").write_text('{"chat_template": "chatml"}\n')
    out = subprocess.run([cli(), "serve-policy", "--model", str(plain), "--token-file", str(model_dir / "token"),
                          "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "crucible_prompt.json: expected auto or none, got 'chatml'" in out.stderr


def test_errors_a_client_sees(server):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server, api_key="wrong-token-0123456789", max_retries=0).models.list()
    c = client(server)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        c.chat.completions.create(model="model", messages=[{"role": "user", "content": "x"}], presence_penalty=0.5)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        c.chat.completions.create(model="model", messages=[{"role": "user", "content": "x"}], logprobs=True,
                                  top_logprobs=3)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        c.completions.create(model="model", prompt=[1] * 4000, max_tokens=2048)
    with pytest.raises(openai.BadRequestError, match="token id"):
        c.completions.create(model="model", prompt=[[5, 10**6]], max_tokens=2)
    req = urllib.request.Request(server + "/completions", data=b"{not json", method="POST",
                                 headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400 and "not JSON" in json.loads(e.value.read())["error"]["message"]
    health = urllib.request.urlopen(server.removesuffix("/v1") + "/health")  # no token needed
    assert json.loads(health.read()) == {"status": "ok"}


def test_many_clients_all_answered(server):
    c = client(server)
    prompts = [f"prompt {i} of the batch" for i in range(12)]

    def one(p):
        r = c.completions.create(model="model", prompt=p, max_tokens=8, temperature=0,
                                 extra_body={"return_token_ids": True})
        return r.model_extra["prompt_token_ids"], r.choices[0].model_extra["token_ids"]

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(one, prompts))
    # Batched or not, each answer is its own prompt's (greedy ties on a random model's near-uniform
    # logits may break differently in a batch, so the texts are not compared).
    assert [a[0] for a in answers] == [one(p)[0] for p in prompts]
    assert all(1 <= len(a[1]) <= 8 for a in answers)
    metrics = urllib.request.urlopen(urllib.request.Request(server.removesuffix("/v1") + "/metrics",
                                                            headers={"Authorization": "Bearer " + TOKEN})).read()
    assert b"crucible_policy_requests_failed_total 0" in metrics


def test_full_queue_and_a_client_that_goes_away(model_dir):
    proc, url = start(model_dir, "--queue", "1")
    try:
        c = client(url)
        # A long stream holds the only place; once its first chunk is here it is running.
        stream = c.completions.create(model="model", prompt="a long one", max_tokens=2000, temperature=1.0,
                                      stream=True)
        next(iter(stream))
        with pytest.raises(openai.RateLimitError, match="queue is full"):
            c.completions.create(model="model", prompt="refused", max_tokens=2)
        stream.close()  # the client goes away mid-stream
        # The server keeps serving: the next request is answered once the place is free again
        # (the openai client's own retries on 429 take it there).
        patient = client(url).with_options(max_retries=20)
        r = patient.completions.create(model="model", prompt="after", max_tokens=3, temperature=0)
        assert r.choices[0].finish_reason == "length"
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
