"""env/eval/harness as a package: the worker's own modules, importing one another with relative imports
(`from .trusted import _len`).

worker.py, the process the evaluator starts, loads this package by path under the private name
`crucible_harness` (the folder is not on sys.path under `python -I`, and stays off it), at import
and before any candidate code exists; importing it imports every module below, in this order, each
importing only from those before it. worker.py then binds what it uses and takes the package and
every one of its modules out of sys.modules again, before any candidate code runs: no candidate can
import a harness module by name, and nothing of the harness imports anything of its own after that
(every name is bound at import). The integrity snapshot holds each module's namespace whole, and
this one's (worker.py, _HARNESS_NAMESPACES). env/eval/harness/README.md says what each module holds."""
# Loaded first, each on its own: the static screen (also imported by path by tools) and the
# sandbox (also run as a script: the isolation probe). Neither imports from the others.
from . import static_checks, confine  # noqa: F401

# The worker's own modules, in the order they import one another (tests/harness/test_loading.py
# checks that each imports only from those before it).
from . import trusted, builds, device, integrity, channel, job, outputs  # noqa: F401
from . import reference, trials, executor  # noqa: F401

MODULES = ("trusted", "builds", "device", "integrity", "channel", "job", "outputs", "reference", "trials",
           "executor")
