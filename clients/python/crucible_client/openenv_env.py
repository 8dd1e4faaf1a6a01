"""crucible's kernel environment as an OpenEnv environment (openenv-core; the contract TRL's
rollouts and NeMo Gym consume), served beside `crucible serve` and backed by it: no second
evaluator, the verdicts are the service's (docs/service.md, "OpenEnv").

An episode is one task: `reset(task=NAME)` (or a task drawn from the service's suite, or from
`tasks`, by `seed`) gives the task's contrastive prompt as chat messages; `step(KernelAction(
response=...))` judges the code in the model's whole answer (its last fenced block that defines
ModelNew) and gives the verdict as the observation, its reward as the step's reward. With
`turns` above 1 each step but the last also gives the next turn's messages (the answers so far
and the service's feedback on their verdicts); an answer with no code ends the episode with the
format-error reward.

Server (a process beside `crucible serve`):

    python -m crucible_client.openenv_env --service-url http://127.0.0.1:8470 --token-file token \\
        --listen 127.0.0.1:8480 [--turns 3] [--tasks 01_relu_scale,06_rmsnorm]

Client:

    from crucible_client.openenv_env import KernelAction, KernelEnv
    with KernelEnv(base_url="http://127.0.0.1:8480").sync() as env:
        r = env.reset(task="01_relu_scale")
        r = env.step(KernelAction(response=my_model(r.observation.messages)))
        r.reward, r.observation.status, r.observation.verdict
"""
from __future__ import annotations

import argparse
import random
import sys
import uuid
from typing import Any, Dict, List, Optional

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

from .client import Client, extract_code


class KernelAction(Action):
    """The model's whole answer to the last messages."""

    response: str = Field(description="the model's answer; the code judged is its last fenced block that defines ModelNew")


class KernelObservation(Observation):
    """What the model sees: the task, the messages of the turn it is to answer (none once the
    episode is over), and the verdict of its last answer."""

    task: str = Field(default="", description="the registered task of the episode")
    messages: List[Dict[str, str]] = Field(default_factory=list, description="the next turn's chat messages")
    turn: int = Field(default=0, description="the turn the messages prompt (1-based); 0 once the episode is over")
    turns_total: int = Field(default=1, description="the episode's turns")
    status: Optional[str] = Field(default=None, description="the last answer's verdict status (format_error: no code)")
    verdict: Optional[Dict[str, Any]] = Field(default=None, description="the service's verdict, as crucible eval --json")
    evaluation_id: Optional[str] = Field(default=None, description="the service's id of the verdict's request")


class KernelState(State):
    """An episode's state: its task and every turn judged so far."""

    task: Optional[str] = None
    turns_total: int = 1
    turns: List[Dict[str, Any]] = Field(default_factory=list)  # [{"answer", "evaluation", "status", "reward"}]


class KernelEnvironment(Environment[KernelAction, KernelObservation, KernelState]):
    """One session's episodes, judged by the `crucible serve` at `service_url`."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session's state is its own; the service queues the verdicts

    def __init__(self, service_url: str, token: str, tasks: Optional[List[str]] = None, turns: int = 1,
                 format_error_reward: float = 0.0, exemplars: Optional[Dict[str, list]] = None):
        super().__init__()
        if turns < 1:
            raise ValueError(f"turns must be at least 1, got {turns}")
        self.client = Client(service_url, token)
        self.tasks = list(tasks) if tasks else None
        self.turns_total = turns
        self.format_error_reward = float(format_error_reward)
        self.exemplars = exemplars or {}
        self._state = KernelState()
        self._done = True

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, task: Optional[str] = None,
              **kwargs: Any) -> KernelObservation:
        if kwargs:
            raise ValueError(f"reset takes seed, episode_id and task; not {', '.join(sorted(kwargs))}")
        if task is None:
            names = self.tasks or self.client.tasks()
            task = random.Random(seed).choice(names)
        self._state = KernelState(episode_id=episode_id or uuid.uuid4().hex, step_count=0, task=task,
                                  turns_total=self.turns_total)
        self._done = False
        p = self.client.prompt(task=task, exemplars=self.exemplars.get(task, self.exemplars.get("*")))
        return KernelObservation(task=task, messages=p["messages"], turn=1, turns_total=self.turns_total)

    def step(self, action: KernelAction, timeout_s: Optional[float] = None, **kwargs: Any) -> KernelObservation:
        if self._done:
            raise ValueError("the episode is over (or never began): reset the environment first")
        st = self._state
        st.step_count += 1
        turn = len(st.turns) + 1
        code = extract_code(action.response)
        if code is None:
            st.turns.append({"answer": action.response, "evaluation": None, "status": "format_error",
                             "reward": self.format_error_reward})
            self._done = True
            return KernelObservation(task=st.task, turn=0, turns_total=st.turns_total, status="format_error",
                                     done=True, reward=self.format_error_reward)
        eid = f"openenv-{st.episode_id}-turn-{turn}"
        verdict = self.client.evaluate(candidate=code, task=st.task, id=eid, timeout_s=timeout_s)
        reward = float(verdict["reward"])
        st.turns.append({"answer": action.response, "evaluation": eid, "status": verdict["status"], "reward": reward})
        if turn >= st.turns_total:
            self._done = True
            return KernelObservation(task=st.task, turn=0, turns_total=st.turns_total, status=verdict["status"],
                                     verdict=verdict, evaluation_id=eid, done=True, reward=reward)
        judged = [{"answer": t["answer"], "evaluation": t["evaluation"]} for t in st.turns]
        p = self.client.prompt(task=st.task, turns=judged, turns_total=st.turns_total,
                               exemplars=self.exemplars.get(st.task, self.exemplars.get("*")))
        return KernelObservation(task=st.task, messages=p["messages"], turn=turn + 1, turns_total=st.turns_total,
                                 status=verdict["status"], verdict=verdict, evaluation_id=eid, done=False,
                                 reward=reward)

    @property
    def state(self) -> KernelState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="crucible", version="0.1.0",
            description="Write a faster PyTorch module (ModelNew) for a KernelBench-format task; the reward is "
                        "crucible's verdict (correctness on several input distributions, speedup measured across "
                        "a process boundary).")


def make_app(service_url: str, token: str, tasks: Optional[List[str]] = None, turns: int = 1,
             format_error_reward: float = 0.0, exemplars: Optional[Dict[str, list]] = None,
             max_sessions: int = 64):
    """The OpenEnv FastAPI application: HTTP /reset, /step, /state, /health, /schema and the /ws
    sessions openenv's EnvClient uses, each session an environment of its own."""
    Client(service_url, token).health()  # a service that cannot be reached fails here, not at the first reset
    return create_app(lambda: KernelEnvironment(service_url, token, tasks, turns, format_error_reward, exemplars),
                      KernelAction, KernelObservation, env_name="crucible", max_concurrent_envs=max_sessions)


class KernelEnv(EnvClient[KernelAction, KernelObservation, KernelState]):
    """openenv's client of a crucible OpenEnv server (`.sync()` for the synchronous one)."""

    def _step_payload(self, action: KernelAction) -> Dict[str, Any]:
        return {"response": action.response}

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[KernelObservation]:
        obs = dict(payload.get("observation", {}))
        obs["done"] = payload.get("done", False)
        obs["reward"] = payload.get("reward")
        return StepResult(observation=KernelObservation(**obs), reward=payload.get("reward"),
                          done=payload.get("done", False))

    def _parse_state(self, payload: Dict[str, Any]) -> KernelState:
        return KernelState(**payload)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m crucible_client.openenv_env",
                                 description="crucible's kernel environment as an OpenEnv server, beside `crucible serve`.")
    ap.add_argument("--service-url", required=True, help="the crucible serve to judge with (http://HOST:PORT)")
    ap.add_argument("--token-file", required=True, help="its token (the file `crucible serve --token-file` reads)")
    ap.add_argument("--listen", default="127.0.0.1:8480", help="HOST:PORT to listen on (port 0: any free one)")
    ap.add_argument("--tasks", default="", help="comma-separated task names a reset without a task draws from (default: the suite)")
    ap.add_argument("--turns", type=int, default=1, help="turns of an episode (default 1)")
    ap.add_argument("--format-error-reward", type=float, default=0.0, help="reward of an answer with no code (default 0)")
    ap.add_argument("--max-sessions", type=int, default=64, help="concurrent sessions (default 64)")
    a = ap.parse_args(argv)
    host, _, port = a.listen.rpartition(":")
    if not host or not port.isdigit():
        ap.error(f"--listen: expected HOST:PORT, got '{a.listen}'")
    try:
        token = open(a.token_file).readline().strip()
    except OSError as e:
        ap.error(f"--token-file: {e}")
    if a.turns < 1:
        ap.error(f"--turns: at least 1, got {a.turns}")
    tasks = [t for t in a.tasks.split(",") if t]
    import socket

    import uvicorn

    app = make_app(a.service_url, token, tasks or None, a.turns, a.format_error_reward, max_sessions=a.max_sessions)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):  # SIGINT, SIGTERM: a graceful stop and exit 0, not the signal again
            self.should_exit = True

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen(128)  # connections wait in the backlog from here until the server accepts them
    bound = sock.getsockname()[1]
    print(f"crucible openenv: listening on http://{host}:{bound} (judged by {a.service_url}; turns {a.turns})", flush=True)
    server = Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
