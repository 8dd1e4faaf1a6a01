"""A client of `crucible serve` (docs/service.md): kernel verdicts over HTTP/JSON, and reward
functions for trainers that are not crucible's own.

    from crucible_client import Client, trl_reward
    client = Client("http://127.0.0.1:8470", token=open("token").read().strip())
    v = client.evaluate(task="01_relu_scale", candidate=source)      # the verdict, as `crucible eval --json`
    reward = trl_reward(client)                                      # GRPOTrainer(reward_funcs=[reward], ...)

Standard library only (urllib), so it installs anywhere a trainer runs.
"""
from .client import Client, ServiceError, extract_code
from .rewards import trl_reward, verl_compute_score

__all__ = ["Client", "ServiceError", "extract_code", "trl_reward", "verl_compute_score"]
