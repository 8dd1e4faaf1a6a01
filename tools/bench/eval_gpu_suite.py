"""tools/bench/eval_gpu_suite.py: where the GPU benchmark suite lives, and loading its files as
modules (shared by eval_precision.py and timing_probe.py)."""
import importlib.util
import os

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "eval_gpu")


def load_module(path, name):
    """Executes the Python file at `path` as a module named `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
