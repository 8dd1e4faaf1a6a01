"""tools/bench/eval_gpu_suite.py: where the GPU benchmark suite lives, loading its files as
modules, and KernelBench-style timing (shared by eval_precision.py and timing_probe.py)."""
import importlib.util
import os

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "eval_gpu")


def load_module(path, name):
    """Executes the Python file at `path` as a module named `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kb_mean_ms(model, inputs, calls=100):
    """KernelBench-style time of one model: 3 untimed calls, then the mean of `calls` CUDA-event
    timings on the current stream, the same inputs reused."""
    import torch

    for _ in range(3):
        model(*inputs)
    torch.cuda.synchronize()
    samples = []
    for _ in range(calls):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        model(*inputs)
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    return sum(samples) / len(samples)
