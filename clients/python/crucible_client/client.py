"""HTTP calls to `crucible serve` (docs/service.md)."""
import json
import re
import time
import urllib.error
import urllib.request


class ServiceError(RuntimeError):
    """An answer of the service that is not a verdict: `status` is the HTTP status (0 when the
    service could not be reached), `message` the service's reason."""

    def __init__(self, status, message):
        super().__init__(f"crucible serve answered {status}: {message}" if status else f"crucible serve: {message}")
        self.status = status
        self.message = message


class Client:
    """One service at `base_url` ("http://127.0.0.1:8470") with its token. A full queue (429) is
    retried after the service's Retry-After, up to `retries` times; every other refusal raises
    ServiceError at once."""

    def __init__(self, base_url, token, timeout_s=900.0, retries=60):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.retries = retries

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode("utf-8")
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(self.base_url + path, data=data, method=method)
            req.add_header("Authorization", "Bearer " + self.token)
            if data is not None:
                req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                    text = r.read().decode("utf-8")
                    return r.status, (json.loads(text) if r.headers.get_content_type() == "application/json" else text)
            except urllib.error.HTTPError as e:
                text = e.read().decode("utf-8", "replace")
                try:
                    why = json.loads(text).get("error", text)
                except ValueError:
                    why = text
                if e.code == 429 and attempt < self.retries:
                    time.sleep(float(e.headers.get("Retry-After", "5")))
                    continue
                raise ServiceError(e.code, why) from None
            except urllib.error.URLError as e:
                raise ServiceError(0, f"cannot reach {self.base_url}: {e.reason}") from None
        raise ServiceError(429, "the queue stayed full")

    def health(self):
        return self._call("GET", "/v1/health")[1]

    def tasks(self):
        """The registered suite's task names."""
        return [t["name"] for t in self._call("GET", "/v1/tasks")[1]["tasks"]]

    def prompt(self, task=None, task_source=None, exemplars=None, hardware=None, turns=None, turns_total=None):
        """The contrastive prompt crucible's own rollouts sample on, for the registered task `task`
        (or the source `task_source`) and earlier implementations `exemplars` ([{"code", "speedup"}],
        shown by increasing speedup within the service's prompt budget): a dict with "messages"
        ([system, user], for the model's chat template), "system", "user", "exemplars_shown".

        A multi-turn episode's next turn: `turns` lists the earlier turns, oldest first, as
        [{"answer": the model's whole response, "evaluation": the id of the evaluate request that
        judged its code}] (pass `id=` to evaluate), `turns_total` the episode's length (default:
        one more turn). The messages then go on with each answer and the feedback on its verdict,
        older turns shortened first to fit; "turn" is the number of the turn they prompt."""
        body = {}
        for key, value in (("task", task), ("task_source", task_source), ("exemplars", exemplars),
                           ("hardware", hardware), ("turns", turns), ("turns_total", turns_total)):
            if value is not None:
                body[key] = value
        return self._call("POST", "/v1/prompt", body)[1]

    def evaluate(self, candidate, task=None, task_source=None, id=None, seed=None, timeout_s=None):
        """The verdict (a dict, as `crucible eval --json` prints it) of `candidate` on the
        registered task `task` or on the task whose source is `task_source`. With `id`, the request
        is judged once however often it is sent (a retry after a lost connection is free)."""
        body = {"candidate": candidate}
        for key, value in (("task", task), ("task_source", task_source), ("id", id), ("seed", seed),
                           ("timeout_s", self.timeout_s if timeout_s is None else timeout_s)):
            if value is not None:
                body[key] = value
        answer = self._call("POST", "/v1/evaluate", body)[1]
        if answer.get("state") != "judged":
            return self.result(answer["id"], timeout_s)
        return answer["verdict"]

    def evaluate_batch(self, requests, timeout_s=None):
        """Verdicts of a list of request dicts (keys as evaluate's); an item the service refused
        is {"error": reason}."""
        body = {"requests": requests, "timeout_s": self.timeout_s if timeout_s is None else timeout_s}
        out = []
        for r in self._call("POST", "/v1/evaluate/batch", body)[1]["results"]:
            if "error" in r:
                out.append(r)
            elif r["state"] == "judged":
                out.append(r["verdict"])
            else:  # pending past the batch's timeout: asked for again by its id
                out.append(self.result(r["id"], timeout_s))
        return out

    def result(self, id, timeout_s=None, poll_s=1.0):
        """The verdict of the request `id`, waiting for it to be judged."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            answer = self._call("GET", "/v1/evaluations/" + urllib.request.quote(id, safe=""))[1]
            if answer.get("state") == "judged":
                return answer["verdict"]
            if time.monotonic() > deadline:
                raise ServiceError(504, f"request {id} was not judged in time")
            time.sleep(poll_s)


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def extract_code(completion):
    """The candidate's source in a model's answer: the last fenced code block that defines
    ModelNew, else the last fenced block, else the whole text when it defines ModelNew; None
    when there is none (as crucible's own response parser decides a format error)."""
    if isinstance(completion, list):  # a conversation: the last message's content
        completion = completion[-1]["content"] if completion else ""
    blocks = _FENCE.findall(completion)
    for block in reversed(blocks):
        if "class ModelNew" in block:
            return block
    if blocks:
        return blocks[-1]
    return completion if "class ModelNew" in completion else None
