#!/usr/bin/env python3
"""What an OpenAI-compatible endpoint costs a policy's sampling (docs/PERFORMANCE.md, "The
service"): `crucible serve-policy` driven as `policy.backend: openai` drives it (chat completions,
n samples a request, several requests in flight), the tokens a second the client receives against
the tokens a second crucible's engine produced for the same calls inside the server (its /metrics:
engine time and generated tokens), side by side in one run, at each concurrency.

  python3 tools/bench/endpoint_tokens.py --crucible build/tools/crucible [--model DIR] [--device cpu]
      [--concurrency 1,4,16] [--requests 16] [--n 4] [--max-tokens 128]

Without --model it makes a tiny random model (crucible tokenizer train + init-model --preset tiny)
in a temporary directory. Each request is one group: a chat of a system and a user message, n
samples, temperature 1, no seed (as the backend sends them: requests that sample alike are
batched into one engine call). Prints one JSON object: per concurrency, the wall time, completion tokens,
client tokens/s, engine tokens/s over the same calls, engine calls (requests batched together).
"""
import argparse
import concurrent.futures
import json
import pathlib
import re
import subprocess
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKEN = "endpoint-bench-token-0123456789"


def metrics(base, token):
    req = urllib.request.Request(base.removesuffix("/v1") + "/metrics", headers={"Authorization": "Bearer " + token})
    text = urllib.request.urlopen(req).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^crucible_policy_(\w+) ([0-9.eE+-]+)$", text, re.M)}


def chat(base, token, model, n, max_tokens, i):
    body = {"model": model, "n": n, "temperature": 1.0, "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": "You write fast PyTorch modules."},
                         {"role": "user", "content": f"Task {i}: write ModelNew for a fused relu and scale."}]}
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=3600).read())["usage"]["completion_tokens"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crucible", default=str(ROOT / "build" / "tools" / "crucible"))
    ap.add_argument("--model", help="a model directory (default: a tiny random model made here)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-batch", type=int, default=64)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        model = a.model
        if model is None:
            subprocess.run([a.crucible, "tokenizer", "train", "--corpus", str(ROOT / "docs"), "--vocab", "2048",
                            "--out", str(tmp / "tok")], check=True, capture_output=True)
            subprocess.run([a.crucible, "init-model", "--preset", "tiny", "--tokenizer", str(tmp / "tok"), "--out",
                            str(tmp / "model")], check=True, capture_output=True)
            model = str(tmp / "model")
        (tmp / "token").write_text(TOKEN + "\n")
        (tmp / "token").chmod(0o600)
        proc = subprocess.Popen([a.crucible, "serve-policy", "--model", model, "--token-file", str(tmp / "token"),
                                 "--listen", "127.0.0.1:0", "--device", a.device, "--served-model-name", "bench",
                                 "--max-batch", str(a.max_batch)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+/v1)", proc.stdout.readline())
        if not m:
            proc.kill()
            raise SystemExit("serve-policy did not start: " + proc.stderr.read())
        base = m.group(1)
        try:
            chat(base, TOKEN, "bench", a.n, 8, 0)  # warm-up: the KV cache, graphs on a GPU
            out = {"model": model, "device": a.device, "n": a.n, "max_tokens": a.max_tokens, "requests": a.requests,
                   "runs": []}
            for c in [int(x) for x in a.concurrency.split(",")]:
                before = metrics(base, TOKEN)
                t0 = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(c) as pool:
                    tokens = sum(pool.map(lambda i: chat(base, TOKEN, "bench", a.n, a.max_tokens, i), range(a.requests)))
                wall = time.perf_counter() - t0
                after = metrics(base, TOKEN)
                engine_s = after["engine_seconds_total"] - before["engine_seconds_total"]
                engine_tokens = after["generated_tokens_total"] - before["generated_tokens_total"]
                out["runs"].append({
                    "concurrency": c, "wall_s": round(wall, 3), "completion_tokens": tokens,
                    "client_tokens_per_s": round(tokens / wall, 1),
                    "engine_tokens_per_s": round(engine_tokens / engine_s, 1) if engine_s > 0 else None,
                    "engine_busy_share": round(engine_s / wall, 3),
                    "engine_calls": int(after["engine_calls_total"] - before["engine_calls_total"]),
                })
            print(json.dumps(out, indent=1))
        finally:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
