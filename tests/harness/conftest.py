"""tests/harness: the evaluator harness's own unit tests (env/eval/harness), CPU only, run by ctest
(tests/harness/CMakeLists.txt) as `PYTHON -m pytest tests/harness`.

The harness's modules are loaded as the worker loads them: worker.py itself is loaded by path,
and its import loads env/eval/harness as the package crucible_harness (its __init__.py imports
static_checks, confine and the modules of its MODULES list, in that order, with relative imports),
binds what it uses and takes the package out of sys.modules again (env/eval/harness/README.md). Loading
worker.py starts no worker: it sets two environment variables (TORCHINDUCTOR_COMPILE_THREADS,
TRITON_F32_DEFAULT), applies torch.compile's first-use patches and touches no device. The fixtures
hand the tests the module objects the worker binds its names from."""
import importlib.util
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
HARNESS_DIR = REPO / "env" / "eval" / "harness"

# The worker's own modules, in the order the package loads them (test_loading checks it is so).
OWN_MODULES = ("trusted", "builds", "device", "integrity", "channel", "job", "outputs", "reference", "trials",
               "executor")

_WORKER = None


def load_worker():
    """env/eval/harness/worker.py as a module (once per process)."""
    global _WORKER
    if _WORKER is None:
        spec = importlib.util.spec_from_file_location("crucible_worker_under_test", HARNESS_DIR / "worker.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _WORKER = mod
    return _WORKER


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    # Small tensors only; two tests at a time share CI's two cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def worker():
    return load_worker()


@pytest.fixture(scope="session")
def harness(worker):
    """{NAME: module} of the worker's own modules (worker._OWN_MODULES)."""
    return worker._OWN_MODULES


@pytest.fixture(scope="session")
def static_checks(worker):
    return worker._STATIC_CHECKS_MODULE


@pytest.fixture(scope="session")
def trusted(harness):
    return harness["trusted"]


@pytest.fixture(scope="session")
def channel(harness):
    return harness["channel"]


@pytest.fixture(scope="session")
def outputs(harness):
    return harness["outputs"]


@pytest.fixture(scope="session")
def reference(harness):
    return harness["reference"]


@pytest.fixture(scope="session")
def trials(harness):
    return harness["trials"]


@pytest.fixture(scope="session")
def executor(harness):
    return harness["executor"]

