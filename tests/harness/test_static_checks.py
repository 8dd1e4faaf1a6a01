"""static_checks.check_source: what a candidate's source may hold, with each finding's check
name, line and message (env/eval/harness/README.md, Checks: Static)."""
import textwrap


def check(static_checks, src, reference_src=""):
    return static_checks.check_source(textwrap.dedent(src).lstrip("\n"), reference_src)


CLEAN = '''
"""A fused ReLU and scale. Mentions threading, __globals__ and eval in its docstring only."""
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

CPP = """
#include <torch/extension.h>
#include <omp.h>
// std::thread, fork() and system() in comments are fine
/* so is pthread_create( in a block comment */
torch::Tensor relu_scale(torch::Tensor x, double s) {
  auto y = torch::empty_like(x);
  #pragma omp parallel for
  for (int64_t i = 0; i < x.numel(); ++i) y.data_ptr<float>()[i] = std::max(x.data_ptr<float>()[i], 0.f) * s;
  return y;
}
"""

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.benchmark = True
os_like = {"environ": 1}


class ModelNew(nn.Module):
    """The candidate."""

    def __init__(self, scale: float = 2.0):
        super().__init__()
        self.scale = scale
        self.__dict__["extra"] = 1

    def forward(self, x):
        try:
            return F.relu(x) * self.scale
        except RuntimeError:
            return torch.relu(x) * math.sqrt(self.scale) ** 2
'''


def test_a_plain_candidate_passes(static_checks):
    assert check(static_checks, CLEAN) == []


def test_a_source_that_does_not_parse_yields_nothing(static_checks):
    # The worker reports it as compile_error when it executes it.
    assert check(static_checks, "def broken(:\n    pass\n") == []


def test_imports_by_class_with_their_lines(static_checks):
    src = '''
    import torch
    import threading
    from subprocess import run
    import socket as s
    import ctypes.util
    import gc
    import importlib
    import model
    from . import helpers
    import numpy
    '''
    assert check(static_checks, src) == [
        ("static:threads", 2, "imports threading (threads)"),
        ("static:threads", 3, "imports subprocess (processes)"),
        ("static:network", 4, "imports socket (sockets)"),
        ("static:ctypes", 5, "imports ctypes.util (raw memory and foreign calls)"),
        ("static:introspection", 6, "imports gc (the garbage collector's object graph)"),
        ("static:dynamic_code", 7, "imports importlib (dynamic imports)"),
        ("static:reference_import", 8, "imports model (the reference or the harness)"),
        ("static:reference_import", 9, "relative import (the reference or the harness)"),
    ]


def test_a_name_imported_from_a_module_is_followed(static_checks):
    src = '''
    from os import system
    from os import path
    system("ls")
    '''
    # The import line names what it is; os.path is fine.
    assert check(static_checks, src) == [("static:threads", 1, "imports os.system (runs a shell command)")]


def test_aliases_are_followed_to_monkey_patching(static_checks):
    src = '''
    import torch as t
    T = t.Tensor
    t.cuda.synchronize = lambda: None
    T.add = None
    '''
    assert check(static_checks, src) == [
        ("static:patching", 3, "assigns torch.cuda.synchronize (monkey-patching)"),
        ("static:patching", 4, "assigns torch.Tensor.add (monkey-patching)"),
    ]


def test_a_name_bound_twice_is_no_alias(static_checks):
    # Flow-insensitive analysis: x is rebound, so x[0] = 0 is not patching math.
    src = '''
    import math
    x = math
    x = [1, 2]
    x[0] = 0
    '''
    assert check(static_checks, src) == []


def test_builtins_are_refused_unless_shadowed(static_checks):
    assert check(static_checks, 'y = eval("1 + 1")\n') == [("static:dynamic_code", 1, "uses builtins.eval (eval())")]
    shadowed = '''
    def eval(s):
        return s
    y = eval("1 + 1")
    '''
    assert check(static_checks, shadowed) == []


def test_introspection_through_attributes_and_computed_names(static_checks):
    src = '''
    def f(e, obj, name):
        a = e.__traceback__.tb_frame
        b = getattr(e, "tb_" + "frame")
        c = obj.__dict__
        d = getattr(obj, "__globals__")
        return a, b, c, d
    '''
    computed = ("getattr() with an attribute name computed at run time (name attributes in the source, or keep "
                "objects in a dict or nn.ModuleList)")
    assert sorted(check(static_checks, src)) == sorted([
        ("static:introspection", 2, "uses .__traceback__"),
        ("static:introspection", 2, "uses .tb_frame"),
        ("static:introspection", 3, computed),
        ("static:introspection", 4, "reads an object's __dict__"),
        ("static:introspection", 5, "reaches .__globals__ through getattr()"),
        ("static:introspection", 5, "names the internal attribute '__globals__' in a string"),
    ])


def test_findings_come_in_source_order(static_checks):
    src = '''
    import signal
    x = 1
    import threading
    '''
    assert [line for _, line, _ in check(static_checks, src)] == [1, 3]


def test_the_reference_class_model(static_checks):
    src = '''
    import torch.nn as nn
    class ModelNew(Model):
        pass
    '''
    assert sorted(check(static_checks, src)) == [
        ("static:subclass_model", 2, "class ModelNew derives from the reference class Model"),
        ("static:subclass_model", 2, "uses the reference class Model"),
    ]


def test_tensor_subclasses(static_checks):
    src = '''
    import torch
    T = torch.Tensor
    class Lazy(T):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    '''
    assert check(static_checks, src) == [
        ("static:tensor_subclass", 3, "class Lazy derives from torch.Tensor"),
        ("static:tensor_subclass", 5, "defines __torch_function__"),
    ]


def test_process_wide_settings(static_checks):
    src = '''
    import os
    import torch
    os.environ["MAX_JOBS"] = "2"
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.mkldnn.verbose = 1
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    '''
    assert check(static_checks, src) == [
        ("static:patching", 4, "assigns an environment variable"),
        ("static:precision", 6, "assigns torch.backends.mkldnn.verbose (a process-wide setting the harness does "
                                "not apply to the candidate's calls alone)"),
        ("static:patching", 7, "uses torch.set_num_threads (changes the process's thread count)"),
        ("static:precision", 8, "uses torch.set_default_dtype (changes the default dtype)"),
    ]


def test_cpp_sources_are_scanned_with_comments_removed(static_checks):
    # A string's findings are on the line of the match: the string's first line plus the
    # newlines before it; on one line, in the order of the patterns' table.
    src = '''
    import torch
    SRC = """
    #include <thread>
    // std::async here is a comment
    void go() { std::thread t(work); t.detach(); }
    """
    MSG = "no process is started here; fork() is named in a message, which is no code"
    '''
    assert check(static_checks, src) == [
        ("static:threads", 5, "C++/CUDA source uses std::thread"),
        ("static:threads", 5, "C++/CUDA source uses .detach()"),
    ]


def test_a_string_that_names_std_is_taken_for_code(static_checks):
    # `std::` alone makes a string look like C++ (_LOOKS_LIKE_CPP), messages too.
    assert check(static_checks, 'MSG = "std::thread is not used"\n') == [
        ("static:threads", 1, "C++/CUDA source uses std::thread")]


def test_cpp_in_a_concatenation(static_checks):
    src = '''
    import torch
    SRC = ("#include <dlfcn.h>  "
           + "void* h = dl" + "open(0, 0);")
    '''
    # The concatenation's line is that of its first part.
    assert check(static_checks, src) == [("static:ctypes", 2, "C++/CUDA source uses dlopen/dlsym")]


def test_overriding_aten_in_cpp(static_checks):
    src = 'S = """\n#include <torch/library.h>\nTORCH_LIBRARY_IMPL(aten, CPU, m) { m.impl("add", &f); }\n"""\n'
    assert check(static_checks, src) == [
        ("static:patching", 3, "C++/CUDA source uses overriding built-in operators (affects the reference)")]
