"""A `verifiers` environment (the v1 API, `verifiers.v1`, that prime-rl trains through) whose
tasks are `crucible serve`'s and whose reward is its verdict (docs/service.md).

Each task is one task of the service's suite; its prompt is the service's contrastive prompt
(POST /v1/prompt: the system and user messages crucible's own rollouts sample on, with the
earlier implementations `exemplars` shown by increasing speedup). The reward takes the code out
of the model's answer (extract_code) and returns the service's verdict's `reward`; an answer with
no code gets `format_error_reward`. The verdict's status is kept with each trace: its metrics
`crucible/<status>` (1 for the trace's status, 0 for the others, so that averages are
fractions) and `crucible/speedup`, and `trace.info["crucible"]` (request id, status, reward,
the whole verdict). Each request's id is a digest of task and code (as trl_reward's): a sample
sent twice is judged once, and `Client.result(id)` finds its verdict later. Rewards of the
rollouts that finish together go to the service as one batch (POST /v1/evaluate/batch).

The plugin id is `crucible-client` (this package; verifiers imports `crucible_client` and takes
the classes it exports): the taskset CrucibleTaskset and its default harness CrucibleChatHarness,
which sends the prompt to the model once, as a chat completion, through verifiers' interception
endpoint, with no tools (`crucible serve-policy` has none, and a kernel answer needs none). An
evaluation (verifiers' `eval`; `vf-eval` from verifiers 0.4):

    eval crucible-client -m model --env.taskset.task.service-url http://127.0.0.1:8470 \\
        --env.taskset.task.token-file token --env.taskset.tasks '["01_relu_scale"]' \\
        --env.agent.runtime.type subprocess --client.base-url http://127.0.0.1:8000/v1 \\
        --client.api-key-var POLICY_TOKEN -n 1 -r 8 --no-push

or, from Python, `load_environment(service_url, token_file=..., tasks=[...])` (a verifiers Env).
The service's token is never written into verifiers' config (which a run saves beside its
traces): it is read from `token_file`, else from the environment variable `token_var`.

Needs `verifiers` (tools/requirements.txt pins it; `pip install 'crucible-client[verifiers]'`);
the rest of crucible_client stays standard-library only.
"""
from __future__ import annotations

import asyncio
import json
import os
import weakref
from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from pydantic import Field

from .client import Client, ServiceError, extract_code
from .rewards import STATUSES, _request_id

PLUGIN_ID = "crucible-client"


class CrucibleTaskConfig(vf.TaskConfig):
    """How the tasks reach `crucible serve` (`--env.taskset.task.*`): read by the reward (on every
    env-server worker) and by the taskset's loader."""

    service_url: str = "http://127.0.0.1:8470"
    """The service's address (`crucible serve --listen`)."""
    token_file: Path | None = None
    """A file whose first line is the service's token (as `crucible serve --token-file`)."""
    token_var: str = "CRUCIBLE_TOKEN"
    """The environment variable holding the token when `token_file` is unset."""
    format_error_reward: float = 0.0
    """The reward of an answer with no code in it (status format_error)."""
    id_prefix: str = "vf-"
    """Prefix of each request's id (the rest is a digest of task and code)."""
    timeout_s: float = Field(900.0, gt=0)
    """How long a verdict may take (queue included) before the reward fails."""
    batch_window_s: float = Field(0.05, ge=0)
    """How long a reward waits for others to share its batch request."""
    max_batch: int = Field(256, ge=1)
    """The most requests in one batch."""
    turns: int = Field(1, ge=1, le=32)
    """Answers the model gives a task: after each but the last, the harness has the code judged
    and sends the next turn's messages (POST /v1/prompt with the earlier turns: each answer and
    the feedback on its verdict). An answer with no code ends the episode."""
    turn_reward: str = Field("best", pattern="^(best|last)$")
    """How a multi-turn episode's reward comes from its turns' verdicts: `best` or `last`."""

    def token(self) -> str:
        if self.token_file is not None:
            lines = Path(self.token_file).expanduser().read_text().split()
            if not lines:
                raise ValueError(f"the token file {self.token_file} is empty")
            return lines[0]
        token = os.environ.get(self.token_var)
        if not token:
            raise ValueError(f"no token for crucible serve: set token_file, or the environment variable {self.token_var}")
        return token

    def client(self) -> Client:
        return Client(self.service_url, self.token(), timeout_s=self.timeout_s)


class CrucibleTasksetConfig(vf.TasksetConfig):
    """Which of the service's tasks load, and the exemplars their prompts show (`--env.taskset.*`)."""

    id: str = PLUGIN_ID
    tasks: list[str] | None = None
    """The service's tasks to load, in this order (None: all of its suite, in its order)."""
    exemplars: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    """Earlier implementations each task's prompt shows: task name (or "*", for every task
    without its own) -> [{"code", "speedup"}]."""
    exemplars_file: Path | None = None
    """A JSON file of the same form as `exemplars`, read at load; `exemplars` wins per task."""
    hardware: str | None = None
    """The hardware the prompt names (default: the service's first device)."""
    task: CrucibleTaskConfig = CrucibleTaskConfig()


class CrucibleData(vf.TaskData):
    """One task of the service's suite, with its contrastive prompt (`prompt`, `system_prompt`)."""

    task: str
    """The task's name in the service's suite: what each reward request names."""
    exemplars_shown: int = 0
    """How many exemplars the service's prompt shows (it drops those over its prompt budget)."""
    exemplars: list[dict[str, Any]] | None = None
    """The exemplars asked for (a later turn's prompt asks for the same)."""
    hardware: str | None = None
    """The hardware the prompt names, as asked for."""
    service: CrucibleTaskConfig | None = None
    """Where the harness has a multi-turn episode's turns judged (the task's config: no token in it)."""


class _Batcher:
    """Verdict requests of one event loop, gathered for `window_s` into batch requests (the
    service judges a batch on every device it has). One per loop and service."""

    def __init__(self, client: Client, window_s: float, max_batch: int) -> None:
        self.client = client
        self.window_s = window_s
        self.max_batch = max_batch
        self.pending: list[tuple[dict, asyncio.Future]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.sending: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks

    async def verdict(self, request: dict) -> dict:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.append((request, future))
        if len(self.pending) >= self.max_batch:
            self._flush()
        elif self.timer is None:
            self.timer = loop.call_later(self.window_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        batch, self.pending = self.pending, []
        if batch:
            task = asyncio.ensure_future(self._send(batch))
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)

    async def _send(self, batch: list[tuple[dict, asyncio.Future]]) -> None:
        try:
            verdicts = await asyncio.to_thread(self.client.evaluate_batch, [r for r, _ in batch])
        except BaseException as e:  # every waiting reward fails with the request's error
            for _, future in batch:
                if not future.done():
                    future.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        for (request, future), verdict in zip(batch, verdicts):
            if future.done():
                continue
            if "error" in verdict:
                future.set_exception(ServiceError(0, f"request {request['id']}: {verdict['error']}"))
            else:
                future.set_result(verdict)


_batchers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict]" = weakref.WeakKeyDictionary()


def _batcher(config: CrucibleTaskConfig) -> _Batcher:
    per_loop = _batchers.setdefault(asyncio.get_running_loop(), {})
    token = config.token()
    key = (config.service_url, token, config.timeout_s, config.batch_window_s, config.max_batch)
    if key not in per_loop:
        per_loop[key] = _Batcher(Client(config.service_url, token, timeout_s=config.timeout_s),
                                 config.batch_window_s, config.max_batch)
    return per_loop[key]


class CrucibleTask(vf.Task[CrucibleData, vf.State, CrucibleTaskConfig]):
    """One task: a single answer, rewarded with the service's verdict of the code in it."""

    @property
    def key(self) -> str:
        return self.data.task

    @vf.stop
    async def enough_turns(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= self.config.turns  # a harness that would ask again is stopped

    async def judge(self, answer: str) -> dict:
        """One answer's verdict: {"id", "status", "reward", "verdict"} (id and verdict None for an
        answer with no code)."""
        config = self.config
        code = extract_code(answer)
        if code is None:
            return {"id": None, "status": "format_error", "reward": float(config.format_error_reward), "verdict": None}
        request_id = _request_id(config.id_prefix, self.data.task, code)
        verdict = await _batcher(config).verdict({"task": self.data.task, "candidate": code, "id": request_id})
        return {"id": request_id, "status": verdict["status"], "reward": float(verdict["reward"]), "verdict": verdict}

    @vf.reward
    async def crucible(self, trace: vf.Trace) -> float:
        """The verdict of the answer (one turn), or of the episode's turns: the best or the last
        (turn_reward); each turn's request id is the one the harness had it judged under, so no
        turn is judged twice. The status and metrics are those of the turn whose reward counts."""
        config = self.config
        answers = trace.assistant_messages or [None]
        judged = [await self.judge((a.content or "") if a is not None else "") for a in answers]
        pick = len(judged) - 1
        if config.turn_reward == "best":
            pick = max(range(len(judged)), key=lambda i: (judged[i]["reward"], -i))
        chosen = judged[pick]
        trace.info["crucible"] = {"id": chosen["id"], "task": self.data.task, "status": chosen["status"],
                                  "reward": chosen["reward"], "verdict": chosen["verdict"]}
        if len(judged) > 1 or config.turns > 1:
            trace.info["crucible"]["turns"] = [{k: j[k] for k in ("id", "status", "reward")} for j in judged]
            trace.info["crucible"]["turn"] = pick + 1
            trace.record_metric("crucible/turns", float(len(judged)))
        for s in STATUSES:
            trace.record_metric("crucible/" + s, 1.0 if s == chosen["status"] else 0.0)
        trace.record_metric("crucible/speedup", float((chosen["verdict"] or {}).get("speedup") or 0.0))
        return chosen["reward"]


class CrucibleTaskset(vf.Taskset[CrucibleTask, CrucibleTasksetConfig]):
    """The service's tasks (or `tasks`), each with its contrastive prompt, asked of the service
    when the taskset loads (in the process that runs the eval or the trainer's orchestrator)."""

    def load(self) -> list[CrucibleTask]:
        config = self.config
        client = config.task.client()
        exemplars = dict(json.loads(Path(config.exemplars_file).read_text())) if config.exemplars_file else {}
        exemplars.update(config.exemplars)
        names = config.tasks if config.tasks is not None else client.tasks()
        out = []
        for i, name in enumerate(names):
            shown = exemplars.get(name, exemplars.get("*"))
            p = client.prompt(task=name, exemplars=shown, hardware=config.hardware)
            data = CrucibleData(idx=i, name=name, task=name, system_prompt=p["system"], prompt=p["user"],
                                exemplars_shown=p["exemplars_shown"], exemplars=shown, hardware=config.hardware,
                                service=config.task if config.task.turns > 1 else None)
            out.append(CrucibleTask(data, config.task))
        return out


class CrucibleChatHarnessConfig(vf.HarnessConfig):
    id: str = PLUGIN_ID


class CrucibleChatHarness(vf.Harness[CrucibleChatHarnessConfig]):
    """The model answers: one chat completion of the task's messages (system, user) a turn, sent
    in-process through the rollout's interception endpoint (which imposes the run's model and
    sampling and records the trace), with no tools. With `turns` above 1 (the task's config),
    each answer but the last is judged by the service under the reward's request id, and the next
    turn's messages are the service's (POST /v1/prompt with the earlier turns: the conversation so
    far with the feedback on each verdict, older turns shortened to fit its budget); an answer with
    no code ends the episode. Needs no program in the runtime, so the `subprocess` runtime serves."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data) -> vf.ProgramResult:
        from openai import AsyncOpenAI
        from verifiers.v1.dialects.chat import message_to_wire

        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages.extend(message_to_wire(m) for m in prompt)
        service = getattr(data, "service", None)
        turns = service.turns if service is not None else 1
        earlier = []
        crucible = service.client() if turns > 1 else None
        async with AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=2) as client:
            for turn in range(turns):
                answer = await client.chat.completions.create(model=ctx.model, messages=messages)
                if turn + 1 == turns:
                    break
                text = answer.choices[0].message.content or ""
                code = extract_code(text)
                if code is None:
                    break  # nothing to judge: the episode ends here
                request_id = _request_id(service.id_prefix, data.task, code)
                await asyncio.to_thread(crucible.evaluate, candidate=code, task=data.task, id=request_id)
                earlier.append({"answer": text, "evaluation": request_id})
                p = await asyncio.to_thread(crucible.prompt, task=data.task, exemplars=data.exemplars,
                                            hardware=data.hardware, turns=earlier, turns_total=turns)
                messages = p["messages"]
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


def load_environment(service_url: str, token: str | None = None, tasks: list[str] | None = None,
                     exemplars: dict[str, list[dict]] | list[dict] | None = None, *, token_file: str | None = None,
                     token_var: str = "CRUCIBLE_TOKEN", hardware: str | None = None,
                     format_error_reward: float = 0.0, runtime: str = "subprocess", **task_settings) -> vf.Env:
    """The verifiers environment (a `SingleAgentEnv`) of `crucible serve` at `service_url`: its
    `tasks` (None: all), each prompted with `exemplars` (task -> [{"code", "speedup"}], or one
    list for every task), answered once by the model (CrucibleChatHarness, in the `runtime`
    runtime) and rewarded with the service's verdict. The token is read from `token_file`, else
    from the environment variable `token_var`; a `token` given here is put into that variable
    of this process (whose env-server workers inherit it), never into the config verifiers saves.
    Other CrucibleTaskConfig fields (id_prefix, timeout_s, batch_window_s, max_batch) may be
    passed by name. Evaluate it with `eval` (its config is `env.config`) or, in-process, with
    `env.serving()` and `env.run_slot(...)`."""
    if token is not None:
        if os.environ.get(token_var, token) != token:
            raise ValueError(f"the environment variable {token_var} already holds another token")
        os.environ[token_var] = token
    if isinstance(exemplars, list):
        exemplars = {"*": exemplars}
    task = CrucibleTaskConfig(service_url=service_url, token_file=token_file, token_var=token_var,
                              format_error_reward=format_error_reward, **task_settings)
    taskset = CrucibleTasksetConfig(tasks=tasks, exemplars=exemplars or {}, hardware=hardware, task=task)
    config = vf.SingleAgentEnvConfig(taskset=taskset, agent=vf.AgentConfig(
        harness=CrucibleChatHarnessConfig(), runtime={"type": runtime}))
    return vf.SingleAgentEnv(config)


__all__ = ["CrucibleChatHarness", "CrucibleChatHarnessConfig", "CrucibleData", "CrucibleTask", "CrucibleTaskConfig",
           "CrucibleTaskset", "CrucibleTasksetConfig", "PLUGIN_ID", "load_environment"]
