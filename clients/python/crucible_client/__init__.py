"""A client of `crucible serve` (docs/service.md): kernel verdicts over HTTP/JSON, and reward
functions for trainers that are not crucible's own.

    from crucible_client import Client, trl_reward
    client = Client("http://127.0.0.1:8470", token=open("token").read().strip())
    v = client.evaluate(task="01_relu_scale", candidate=source)      # the verdict, as `crucible eval --json`
    reward = trl_reward(client)                                      # GRPOTrainer(reward_funcs=[reward], ...)

Standard library only (urllib), so it installs anywhere a trainer runs. With `verifiers`
installed, this package is also a verifiers environment (plugin id `crucible-client`: the
taskset and harness of crucible_client.verifiers_env, imported only when asked for).
"""
import importlib.util as _importlib_util

from .client import Client, ServiceError, extract_code
from .rewards import trl_reward, verl_compute_score

# What verifiers' plugin loader looks for in `__all__` (one Taskset subclass, one Harness
# subclass), imported from verifiers_env on first use, and listed only where verifiers is.
_VERIFIERS = ("CrucibleTaskset", "CrucibleChatHarness", "load_environment")

__all__ = ["Client", "ServiceError", "extract_code", "trl_reward", "verl_compute_score"]
if _importlib_util.find_spec("verifiers") is not None:
    __all__ += list(_VERIFIERS)


def __getattr__(name):
    if name in _VERIFIERS:
        from . import verifiers_env

        return getattr(verifiers_env, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
