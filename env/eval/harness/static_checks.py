"""Static anti-hacking checks on a candidate's source, run by the worker before any candidate
code executes (docs/evaluator-protocol.md, step 3).

    check_source(src, reference_src) -> [(check_name, lineno, message), ...]

Check names are "static:<class>". The checks work on the Python AST, following import aliases
(`import torch as t`, `from os import system`, `T = torch`), plus regular expressions over the
string constants that hold C++/CUDA sources for load_inline (comments stripped). A source that
does not parse yields no findings here: the worker reports it as compile_error when it runs it.

They refuse only constructs that have no legitimate use in a kernel: threads and processes,
sockets, raw memory and ctypes, frame and garbage-collector introspection, dynamic code,
tensor subclasses that defer work, assignments to torch's, the timer's or synchronisation's
attributes and process-wide settings, and importing the task or the harness. Everything else is
judged by what happens when it runs (docs/evaluator.md, Threat model): a fallback by whether the
candidate's own kernels ran, caching by fresh inputs and checked timed outputs, files by the
sandbox (a worker writes only in its scratch directory), precision by the outputs' error
against the reference's own rounding error, torch.backends settings (cudnn.benchmark, TF32,
fp32_precision, the attention backends ...) by applying them to the candidate's calls only,
where their effect on precision is judged by the outputs' error like any kernel's.
"""
from __future__ import annotations

import ast
import builtins as _builtins_module
import re

__all__ = ["check_source"]

# ------------------------------------------------------------------------------------------------
# Imports.

# Imports are refused by what they are (the classes below) or when they name the reference or
# the harness (_REFERENCE_NAMES); any other module may be imported.

# Modules whose import is a specific class of problem (checked before the allowlist).
_MODULE_CLASSES = [
    # (dotted prefix, check class, what it is)
    ("threading", "threads", "threads"),
    ("_thread", "threads", "threads"),
    ("multiprocessing", "threads", "processes"),
    ("concurrent", "threads", "thread/process pools"),
    ("subprocess", "threads", "processes"),
    ("asyncio", "threads", "asynchronous tasks"),
    ("sched", "threads", "scheduled tasks"),
    ("signal", "threads", "signal handlers"),
    ("pty", "threads", "processes"),
    ("torch.multiprocessing", "threads", "processes"),
    ("torch.futures", "threads", "asynchronous futures"),
    ("socket", "network", "sockets"),
    ("socketserver", "network", "sockets"),
    ("select", "network", "sockets"),
    ("selectors", "network", "sockets"),
    ("urllib", "network", "network access"),
    ("http", "network", "network access"),
    ("requests", "network", "network access"),
    ("ssl", "network", "network access"),
    ("ftplib", "network", "network access"),
    ("smtplib", "network", "network access"),
    ("xmlrpc", "network", "network access"),
    ("zmq", "network", "sockets (the harness's own transport)"),
    ("torch.distributed", "network", "distributed communication"),
    ("torch.hub", "network", "downloads"),
    ("ctypes", "ctypes", "raw memory and foreign calls"),
    ("_ctypes", "ctypes", "raw memory and foreign calls"),
    ("cffi", "ctypes", "raw memory and foreign calls"),
    ("mmap", "ctypes", "raw memory mappings"),
    ("numpy.ctypeslib", "ctypes", "raw memory and foreign calls"),
    ("gc", "introspection", "the garbage collector's object graph"),
    ("inspect", "introspection", "frame and object introspection"),
    ("traceback", "introspection", "frame introspection"),
    ("importlib", "dynamic_code", "dynamic imports"),
    ("imp", "dynamic_code", "dynamic imports"),
    ("runpy", "dynamic_code", "running code dynamically"),
    ("pkgutil", "dynamic_code", "dynamic imports"),
    ("zipimport", "dynamic_code", "dynamic imports"),
    ("marshal", "dynamic_code", "code objects"),
    ("types", "dynamic_code", "constructing code and functions"),
    ("codeop", "dynamic_code", "compiling code"),
    ("builtins", "patching", "the builtins module"),
    ("torch.overrides", "tensor_subclass", "__torch_function__ machinery"),
    ("torch.utils._python_dispatch", "tensor_subclass", "__torch_dispatch__ machinery"),
]

# Module names that mean "the reference or the harness".
_REFERENCE_NAMES = re.compile(
    r"^(__main__|model|models|reference|ref|task|tasks|problem|kernelbench|worker|harness|"
    r"static_checks|crucible.*|env)$", re.I)

# ------------------------------------------------------------------------------------------------
# Dotted names (after alias resolution) that are problems wherever they are used.

_NAME_CLASSES: list[tuple[str, str, str]] = [
    # os: processes and signals (file operations are the sandbox's to contain).
    ("os.fork", "threads", "forks the process"),
    ("os.forkpty", "threads", "forks the process"),
    ("os.system", "threads", "runs a shell command"),
    ("os.popen", "threads", "runs a shell command"),
    ("os.spawn", "threads", "spawns a process"),
    ("os.exec", "threads", "replaces the process"),
    ("os.posix_spawn", "threads", "spawns a process"),
    ("os.register_at_fork", "threads", "registers fork hooks"),
    ("os.kill", "threads", "signals processes"),
    ("os.killpg", "threads", "signals processes"),
    ("os.wait", "threads", "waits on processes"),
    ("os.putenv", "patching", "changes the environment"),
    ("os.unsetenv", "patching", "changes the environment"),
    ("sys._getframe", "introspection", "reads the call stack"),
    ("sys._current_frames", "introspection", "reads other threads' stacks"),
    ("sys.settrace", "introspection", "installs a trace function"),
    ("sys.setprofile", "introspection", "installs a profile function"),
    ("sys.gettrace", "introspection", "reads the trace function"),
    ("sys.getprofile", "introspection", "reads the profile function"),
    ("sys.exc_info", "introspection", "reads frames through tracebacks"),
    ("sys.exception", "introspection", "reads frames through tracebacks"),
    ("sys.last_traceback", "introspection", "reads frames through tracebacks"),
    ("sys.getrefcount", "introspection", "inspects reference counts"),
    ("sys.modules", "dynamic_code", "reaches loaded modules (the harness, the task)"),
    ("sys.meta_path", "dynamic_code", "changes the import system"),
    ("sys.path_hooks", "dynamic_code", "changes the import system"),
    ("sys.path", "dynamic_code", "changes the import path"),
    ("sys.addaudithook", "introspection", "installs an audit hook"),
    ("sys.setswitchinterval", "patching", "changes interpreter-wide settings"),
    ("sys.setdlopenflags", "patching", "changes interpreter-wide settings"),
    ("sys.stdout", "patching", "replaces the process's streams"),
    ("sys.stderr", "patching", "replaces the process's streams"),
    ("sys.stdin", "patching", "replaces the process's streams"),
    ("builtins.eval", "dynamic_code", "eval()"),
    ("builtins.exec", "dynamic_code", "exec()"),
    ("builtins.compile", "dynamic_code", "compile()"),
    ("builtins.__import__", "dynamic_code", "__import__()"),
    ("builtins.breakpoint", "introspection", "breakpoint()"),
    ("builtins.vars", "introspection", "vars() (module and object dictionaries)"),
    ("builtins.memoryview", "ctypes", "memoryview() (raw buffers)"),
    ("builtins.__builtins__", "patching", "__builtins__"),
    ("torch.jit.fork", "threads", "asynchronous tasks on the inter-op thread pool"),
    ("torch.jit._fork", "threads", "asynchronous tasks on the inter-op thread pool"),
    ("torch.jit.wait", "threads", "asynchronous tasks on the inter-op thread pool"),
    ("torch.jit._wait", "threads", "asynchronous tasks on the inter-op thread pool"),
    ("torch.cuda.cudart", "ctypes", "raw CUDA runtime access"),
    ("torch.nn.modules.module.register_module_", "patching", "global module hooks (affect the reference)"),
    ("torch.nn.modules.module._global_", "patching", "global module hooks (affect the reference)"),
    ("torch.set_num_threads", "patching", "changes the process's thread count"),
    ("torch.set_num_interop_threads", "patching", "changes the process's thread count"),
    ("torch.use_deterministic_algorithms", "patching", "changes process-wide settings"),
    ("torch.set_default_device", "patching", "changes process-wide settings"),
    ("torch.set_default_tensor_type", "precision", "changes the default dtype"),
    ("torch.set_default_dtype", "precision", "changes the default dtype"),
    ("torch.set_flush_denormal", "precision", "changes denormal handling"),
    ("torch.overrides", "tensor_subclass", "__torch_function__ machinery"),
    ("torch.utils._python_dispatch", "tensor_subclass", "__torch_dispatch__ machinery"),
    ("torch.multiprocessing", "threads", "processes"),
    ("torch.distributed", "network", "distributed communication"),
    ("torch.hub", "network", "downloads"),
    ("torch.futures", "threads", "asynchronous futures"),
    ("numpy.ctypeslib", "ctypes", "raw memory"),
    ("numpy.memmap", "ctypes", "memory-mapped files"),
]

_OS_ENVIRON_WRITES = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}
# Environment variables a candidate may set: they only steer its own extension builds.
_ENV_WRITABLE = {"TORCH_CUDA_ARCH_LIST", "MAX_JOBS"}

# Attribute names that are problems on any object.
_ATTR_CLASSES = {
    "f_back": "introspection", "f_globals": "introspection", "f_locals": "introspection",
    "f_builtins": "introspection", "f_code": "introspection", "f_trace": "introspection",
    "tb_frame": "introspection", "tb_next": "introspection", "gi_frame": "introspection",
    "cr_frame": "introspection", "ag_frame": "introspection", "gi_code": "introspection",
    "__traceback__": "introspection", "__code__": "introspection", "__globals__": "introspection",
    "__closure__": "introspection", "__subclasses__": "introspection", "__bases__": "introspection",
    "__base__": "introspection", "__mro__": "introspection", "__self__": "introspection",
    "__builtins__": "patching", "__loader__": "dynamic_code", "__spec__": "dynamic_code",
    "__import__": "dynamic_code", "__setattr__": "patching", "__delattr__": "patching",
    "__getattribute__": "introspection", "__reduce__": "introspection",
    "__reduce_ex__": "introspection",
    "__torch_function__": "tensor_subclass", "__torch_dispatch__": "tensor_subclass",
    "_make_subclass": "tensor_subclass", "_make_wrapper_subclass": "tensor_subclass",
    "as_subclass": "tensor_subclass", "_disabled_torch_function_impl": "tensor_subclass",
    "_disabled_torch_dispatch_impl": "tensor_subclass", "TorchFunctionMode": "tensor_subclass",
    "TorchDispatchMode": "tensor_subclass",
}

# String constants that are attribute names used to reach internals via getattr() & co.
_DANGEROUS_STRINGS = {k for k, v in _ATTR_CLASSES.items()
                      if v in ("introspection", "patching", "dynamic_code", "tensor_subclass")} | {
    "__dict__", "__import__", "eval", "exec", "__builtins__", "modules", "_getframe", "settrace",
    "setprofile"}

# Base classes that make a tensor subclass or a mode.
_TENSOR_BASES = {"torch.Tensor", "torch._C.TensorBase", "torch._C._TensorBase", "torch.nn.Parameter",
                 "torch.nn.parameter.Parameter", "torch.nn.parameter.Buffer", "torch.nn.Buffer",
                 "torch.overrides.TorchFunctionMode", "torch.utils._python_dispatch.TorchDispatchMode",
                 "torch._C._TensorMeta", "torch._tensor.Tensor"}

# Imported roots whose attributes must not be assigned (any imported module counts; these are
# named in the message).
_PATCH_ROOTS_PRECISION = ("torch.backends",)
# torch.backends settings a candidate may set (attributes) or switch (calls): the worker applies
# them to its calls only, the reference runs under the harness's (worker.py,
# _CANDIDATE_FLAG_SETTERS, which holds the same list), and those that change the precision of
# arithmetic (TF32 and the like) are judged by the outputs' error.
_CANDIDATE_FLAGS = {"benchmark", "deterministic", "enabled", "allow_tf32", "fp32_precision",
                    "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction",
                    "allow_fp16_accumulation"}
_CANDIDATE_FLAG_CALLS = {"flags", "enable_flash_sdp", "enable_mem_efficient_sdp", "enable_math_sdp",
                         "enable_cudnn_sdp", "allow_fp16_bf16_reduction_math_sdp", "sdp_kernel",
                         "preferred_blas_library"}
# torch.backends functions that only read.
_BACKEND_READS = {"is_available", "is_built", "version", "get_device_name", "flash_sdp_enabled",
                  "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled",
                  "fp16_bf16_reduction_math_sdp_allowed", "is_flash_attention_available",
                  "can_use_flash_attention", "can_use_efficient_attention", "can_use_cudnn_attention"}

# ------------------------------------------------------------------------------------------------
# C++/CUDA source patterns (inside string constants; comments removed first).

_CPP_PATTERNS: list[tuple[re.Pattern, str, str]] = [
    (re.compile(r"\bstd\s*::\s*j?thread\b"), "threads", "std::thread"),
    (re.compile(r"\bpthread_create\s*\("), "threads", "pthread_create"),
    (re.compile(r"\bstd\s*::\s*async\b"), "threads", "std::async"),
    (re.compile(r"\.\s*detach\s*\(\s*\)"), "threads", ".detach()"),
    (re.compile(r"\bat\s*::\s*launch\s*\("), "threads", "at::launch (inter-op thread pool)"),
    (re.compile(r"\bat\s*::\s*intraop_launch\b"), "threads", "at::intraop_launch"),
    (re.compile(r"(?<![.\w>:])(?:fork|vfork)\s*\(\s*\)"), "threads", "fork()"),
    (re.compile(r"\b(?:system|popen|execv[pe]*|execl[pe]*|posix_spawnp?)\s*\("), "threads",
     "a process-spawning call"),
    (re.compile(r"\bcudaLaunchHostFunc\b|\bcudaStreamAddCallback\b"), "threads",
     "host callbacks on a driver thread"),
    (re.compile(r"#\s*include\s*<\s*(?:sys/socket\.h|netinet/|arpa/inet\.h|netdb\.h)"), "network",
     "socket headers"),
    (re.compile(r"\b(?:socket|connect|bind|sendto|recvfrom)\s*\(\s*(?:AF_|PF_|[a-z_]*fd\b)"),
     "network", "sockets"),
    (re.compile(r"\bdl(?:open|sym|mopen)\s*\("), "ctypes", "dlopen/dlsym"),
    (re.compile(r"\bmprotect\s*\(|/proc/self/mem"), "ctypes", "rewriting process memory"),
    (re.compile(r"\bPy(?:Import_\w+|Run_\w+|Eval_EvalCode\w*|Eval_GetFrame|Eval_GetGlobals|"
                r"Eval_GetBuiltins|Eval_GetLocals|Sys_GetObject|Sys_SetObject)\b"),
     "dynamic_code", "Python C API imports/evaluation"),
    (re.compile(r"\b(?:py|pybind11)\s*::\s*(?:module_?\s*::\s*import|exec|eval|eval_file)\b"),
     "dynamic_code", "pybind11 imports/evaluation"),
    (re.compile(r"\bPy(?:Object_SetAttr\w*|Object_DelAttr\w*|Dict_SetItem\w*|Dict_DelItem\w*|"
                r"Module_AddObject\w*)\b"), "patching",
     "setting Python attributes from C++"),
    (re.compile(r"\bTORCH_LIBRARY_(?:IMPL|FRAGMENT)\s*\(\s*(?:aten|prim|prims|_)\b"), "patching",
     "overriding built-in operators (affects the reference)"),
    (re.compile(r"\bTORCH_LIBRARY\s*\(\s*(?:aten|prim|prims)\b"), "patching",
     "overriding built-in operators (affects the reference)"),
    (re.compile(r"\b(?:at::globalContext\s*\(\s*\)\s*\.\s*set\w+|at::set_num_threads|"
                r"at::set_num_interop_threads|omp_set_num_threads|omp_set_dynamic)\s*\("),
     "patching", "changing process-wide settings"),
]
_CPP_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
# Strings that look like C/C++/CUDA code (other strings, e.g. messages, are not scanned).
_LOOKS_LIKE_CPP = re.compile(
    r"#\s*include|__global__|__device__|\btorch::|\bat::|\bstd::|PYBIND11|TORCH_LIBRARY|;\s*$|"
    r"[;{}]\s*\n|\bint\s+\w+\s*\(|\bvoid\s+\w+\s*\(", re.M)


# ------------------------------------------------------------------------------------------------

def _dotted_matches(name: str, prefix: str) -> bool:
    """True when `name` is `prefix` or lies below it; prefixes ending in '_' or a partial word
    (like os.spawn, os.exec, register_module_) match any continuation."""
    if name == prefix or name.startswith(prefix + "."):
        return True
    last = prefix.rsplit(".", 1)[-1]
    if prefix.endswith("_") or last in ("spawn", "exec", "wait", "posix_spawn"):
        return name.startswith(prefix)
    return False


def _module_class(modname: str):
    """(check class, description) for a module name, or None."""
    best = None
    for prefix, cls, what in _MODULE_CLASSES:
        if modname == prefix or modname.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, cls, what)
    return None if best is None else (best[1], best[2])


def _name_class(dotted: str):
    best = None
    for prefix, cls, what in _NAME_CLASSES:
        if _dotted_matches(dotted, prefix):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, cls, what)
    if best is not None:
        return best[1], best[2]
    if dotted.startswith("builtins."):
        return None  # builtins reached by name: only the entries above are problems
    cls = _module_class(dotted)
    if cls is not None:
        return cls
    return None


class _Checker:
    def __init__(self, src: str, reference_src: str):
        self.src = src
        self.problems: list[tuple[str, int, str]] = []
        self._seen: set[tuple[str, int, str]] = set()
        self.aliases: dict[str, str] = {}     # local name -> dotted module path
        self.bound: set[str] = set()          # names bound anywhere (shadow builtins)
        self.deleted: set[str] = set()
        self.docstrings: set[int] = set()     # id() of docstring Constant nodes
        self.stores: dict[str, int] = {}      # how often each name is bound
        self.imported: set[str] = set()       # names bound by import statements

    # -- reporting ---------------------------------------------------------------------------
    def add(self, cls: str, node, message: str):
        line = getattr(node, "lineno", 0) or 0
        key = ("static:" + cls, line, message)
        if key not in self._seen:
            self._seen.add(key)
            self.problems.append(key)

    # -- pass 1: aliases and bindings --------------------------------------------------------
    def collect(self, tree: ast.AST):
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body
                if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                        and isinstance(body[0].value.value, str):
                    self.docstrings.add(id(body[0].value))
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                        self.imported.add(a.asname)
                    else:
                        top = a.name.split(".")[0]
                        self.aliases[top] = top
                        self.imported.add(top)
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0 and node.module:
                    for a in node.names:
                        if a.name != "*":
                            self.aliases[a.asname or a.name] = node.module + "." + a.name
                            self.imported.add(a.asname or a.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.bound.add(node.name)
                if not isinstance(node, ast.ClassDef):
                    args = node.args
                    for a in args.posonlyargs + args.args + args.kwonlyargs:
                        self.bound.add(a.arg)
                        self.stores[a.arg] = self.stores.get(a.arg, 0) + 2
                    if args.vararg:
                        self.bound.add(args.vararg.arg)
                    if args.kwarg:
                        self.bound.add(args.kwarg.arg)
            elif isinstance(node, ast.Lambda):
                for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                    self.bound.add(a.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.bound.add(node.id)
                self.stores[node.id] = self.stores.get(node.id, 0) + 1
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Del):
                self.deleted.add(node.id)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                self.bound.add(node.name)
        # Simple aliases by assignment (T = torch; sync = torch.cuda.synchronize), to a fixpoint.
        # Only names bound exactly once count: the analysis is flow-insensitive, and a name that
        # is rebound (x = math.pi; ...; x = tensor) must not make x[...] = 0 look like patching.
        for _ in range(3):
            changed = False
            for node in ast.walk(tree):
                if isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if node.value is None:
                        continue
                    target_value = self.resolve(node.value)
                    if target_value is None:
                        continue
                    for t in targets:
                        if isinstance(t, ast.Name) and self.stores.get(t.id, 0) == 1 \
                                and t.id not in self.imported and self.aliases.get(t.id) != target_value:
                            self.aliases[t.id] = target_value
                            changed = True
                elif isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
                    v = self.resolve(node.value)
                    if v is not None and self.stores.get(node.target.id, 0) == 1 \
                            and node.target.id not in self.imported and self.aliases.get(node.target.id) != v:
                        self.aliases[node.target.id] = v
                        changed = True
            if not changed:
                break

    # -- name resolution ---------------------------------------------------------------------
    def resolve(self, node) -> str | None:
        """Dotted path of an expression rooted at an imported module or a builtin, else None."""
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.aliases[node.id]
            if node.id == "__builtins__":
                return "builtins.__builtins__"
            if hasattr(_builtins_module, node.id) and (node.id not in self.bound or node.id in self.deleted):
                return "builtins." + node.id
            return None
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return None if base is None else base + "." + node.attr
        return None

    def root_is_module(self, node) -> str | None:
        """For an assignment target: the dotted path of the object whose attribute or item is set,
        when that object is (inside) an imported module or builtins."""
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
            d = self.resolve(node)
            if d is not None:
                return d
        return None

    # -- pass 2 ------------------------------------------------------------------------------
    def run(self, tree: ast.Module):
        self.collect(tree)
        for node in ast.walk(tree):
            m = getattr(self, "visit_" + type(node).__name__, None)
            if m is not None:
                m(node)
        self.check_strings(tree)

    def check_import_name(self, node, modname: str):
        top = modname.split(".")[0]
        cls = _module_class(modname)
        if cls is not None:
            self.add(cls[0], node, f"imports {modname} ({cls[1]})")
            return
        if _REFERENCE_NAMES.match(top):
            self.add("reference_import", node, f"imports {modname} (the reference or the harness)")

    def visit_Import(self, node: ast.Import):
        for a in node.names:
            self.check_import_name(node, a.name)

    def visit_ImportFrom(self, node: ast.ImportFrom):
        if node.level:
            self.add("reference_import", node, "relative import (the reference or the harness)")
            return
        mod = node.module or ""
        self.check_import_name(node, mod)
        for a in node.names:
            if a.name == "*":
                continue
            full = mod + "." + a.name
            hit = _name_class(full)
            if hit is not None and _module_class(mod) is None:
                self.add(hit[0], node, f"imports {full} ({hit[1]})")

    def check_dotted_use(self, node, dotted: str):
        hit = _name_class(dotted)
        if hit is not None:
            self.add(hit[0], node, f"uses {dotted} ({hit[1]})")
            return True
        return False

    def visit_Name(self, node: ast.Name):
        if isinstance(node.ctx, ast.Load):
            if node.id == "Model":
                self.add("subclass_model", node, "uses the reference class Model")
                return
            if node.id in _ATTR_CLASSES and node.id.startswith("__"):
                self.add(_ATTR_CLASSES[node.id], node, f"uses {node.id}")
                return
            d = self.resolve(node)
            if d is not None and d.startswith("builtins."):
                self.check_dotted_use(node, d)
        elif isinstance(node.ctx, ast.Store) and node.id == "__builtins__":
            self.add("patching", node, "assigns __builtins__")

    def visit_Attribute(self, node: ast.Attribute):
        attr = node.attr
        if attr in _ATTR_CLASSES:
            self.add(_ATTR_CLASSES[attr], node, f"uses .{attr}")
        if attr == "__dict__":
            base = node.value
            if not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
                self.add("introspection", node, "reads an object's __dict__")
        d = self.resolve(node)
        if d is not None:
            # Only report the outermost resolvable attribute once: the parent visit covers it.
            self.check_dotted_use(node, d)

    def visit_Call(self, node: ast.Call):
        f = node.func
        d = self.resolve(f)
        if d in ("builtins.setattr", "builtins.delattr") and node.args:
            target = node.args[0]
            t = self.resolve(target) or self.root_is_module(target)
            setting = len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in _CANDIDATE_FLAGS
            if t is not None and t.startswith(_PATCH_ROOTS_PRECISION) and setting and d == "builtins.setattr":
                pass  # a setting the worker applies to the candidate's own calls only
            elif t is not None:
                cls = "precision" if t.startswith(_PATCH_ROOTS_PRECISION) else "patching"
                self.add(cls, node, f"{d.split('.')[1]}() on {t}")
            elif isinstance(target, ast.Call):
                self.add("patching", node, f"{d.split('.')[1]}() on a computed object")
        if d in ("builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.hasattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str):
            name = node.args[1].value
            if name in _ATTR_CLASSES:
                self.add(_ATTR_CLASSES[name], node, f"reaches .{name} through {d.split('.')[1]}()")
            elif name == "__dict__":
                self.add("introspection", node, "reaches __dict__ through getattr()")
        if d in ("builtins.setattr", "builtins.delattr") and len(node.args) >= 2 \
                and not isinstance(node.args[1], ast.Constant):
            t = self.resolve(node.args[0])
            if t is not None and not t.startswith("builtins."):
                self.add("dynamic_code", node, f"{d.split('.')[1]}() with a computed name on {t}")
        # An attribute whose name is put together at run time can be any of those refused above
        # ("tb_" + "frame", "f_" + "back" ...: a walk from an exception to the harness's frames).
        if d in ("builtins.getattr", "builtins.hasattr", "builtins.setattr", "builtins.delattr") \
                and len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant):
            self.add("introspection", node, f"{d.split('.')[1]}() with an attribute name computed at run time "
                                            "(name attributes in the source, or keep objects in a dict or nn.ModuleList)")
        if d in ("operator.attrgetter", "operator.methodcaller") and \
                any(not isinstance(a, ast.Constant) for a in node.args[:1 if d.endswith("methodcaller") else None]):
            self.add("introspection", node, f"{d} with an attribute name computed at run time")
        # os.environ writes through methods
        if isinstance(f, ast.Attribute) and f.attr in _OS_ENVIRON_WRITES and self.resolve(f.value) == "os.environ":
            key = node.args[0] if node.args else None
            if not (f.attr in ("setdefault", "__setitem__") and isinstance(key, ast.Constant)
                    and key.value in _ENV_WRITABLE):
                self.add("patching", node, f"changes the environment (os.environ.{f.attr})")
        if d is not None:
            # torch.backends.*: reading is fine, calling a setter/flags context is not.
            if d.startswith("torch.backends.") and d.rsplit(".", 1)[-1] not in _BACKEND_READS | _CANDIDATE_FLAG_CALLS:
                self.add("precision", node, f"calls {d} (a process-wide setting the harness does not "
                                            "apply to the candidate's calls alone)")
            if d.startswith("torch.library.") or d.startswith("torch._C._dispatch"):
                for a in list(node.args) + [k.value for k in node.keywords]:
                    if isinstance(a, ast.Constant) and isinstance(a.value, str) and \
                            re.match(r"^\s*(aten|prim|prims|_)\s*(::|$)", a.value):
                        self.add("patching", node, f"{d} on built-in operators (affects the reference)")
                        break
        if isinstance(f, ast.Name) and f.id == "Model":
            self.add("subclass_model", node, "calls the reference class Model")

    def _check_target(self, t, node, what: str):
        if isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self._check_target(e, node, what)
            return
        if isinstance(t, ast.Starred):
            self._check_target(t.value, node, what)
            return
        if isinstance(t, ast.Name):
            if t.id == "__builtins__":
                self.add("patching", node, f"{what} __builtins__")
            return
        if isinstance(t, (ast.Attribute, ast.Subscript)):
            root = self.root_is_module(t)
            if root is None:
                return
            if root.startswith(_PATCH_ROOTS_PRECISION) and isinstance(t, ast.Attribute) and t.attr in _CANDIDATE_FLAGS:
                return  # the worker applies it to the candidate's own calls only
            if root.startswith(_PATCH_ROOTS_PRECISION) and isinstance(t, ast.Attribute) and _not_in_torch(root, t.attr):
                return  # torch has no such setting (cudnn.workspace_limit): nothing reads it
            if root.startswith(_PATCH_ROOTS_PRECISION):
                self.add("precision", node, f"{what} {root}{'.' + t.attr if isinstance(t, ast.Attribute) else '[...]'} "
                                            "(a process-wide setting the harness does not apply to the "
                                            "candidate's calls alone)")
            elif root == "os.environ" or root.startswith("os.environ"):
                key = t.slice if isinstance(t, ast.Subscript) else None
                if not (isinstance(key, ast.Constant) and key.value in _ENV_WRITABLE):
                    self.add("patching", node, f"{what} an environment variable")
            else:
                name = root + ("." + t.attr if isinstance(t, ast.Attribute) else "[...]")
                self.add("patching", node, f"{what} {name} (monkey-patching)")

    def visit_Assign(self, node: ast.Assign):
        for t in node.targets:
            self._check_target(t, node, "assigns")

    def visit_AugAssign(self, node: ast.AugAssign):
        self._check_target(node.target, node, "assigns")

    def visit_AnnAssign(self, node: ast.AnnAssign):
        self._check_target(node.target, node, "assigns")

    def visit_Delete(self, node: ast.Delete):
        for t in node.targets:
            self._check_target(t, node, "deletes")

    def visit_Global(self, node: ast.Global):
        if "__builtins__" in node.names:
            self.add("patching", node, "declares __builtins__ global")

    def visit_ClassDef(self, node: ast.ClassDef):
        for b in node.bases:
            d = self.resolve(b)
            if isinstance(b, ast.Name) and b.id == "Model":
                self.add("subclass_model", node, f"class {node.name} derives from the reference class Model")
            elif isinstance(b, ast.Attribute) and b.attr == "Model":
                self.add("subclass_model", node, f"class {node.name} derives from a class named Model")
            elif d is not None and (d in _TENSOR_BASES or d.endswith(".TorchFunctionMode")
                                    or d.endswith(".TorchDispatchMode")):
                self.add("tensor_subclass", node, f"class {node.name} derives from {d}")
        for k in node.keywords:
            if k.arg == "metaclass":
                d = self.resolve(k.value)
                if d is not None and "torch" in d:
                    self.add("tensor_subclass", node, f"class {node.name} uses the metaclass {d}")
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    item.name in ("__torch_function__", "__torch_dispatch__"):
                self.add("tensor_subclass", item, f"defines {item.name}")

    def visit_FunctionDef(self, node):
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self.add("tensor_subclass", node, f"defines {node.name}")

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Constant(self, node: ast.Constant):
        v = node.value
        if isinstance(v, str) and v in _DANGEROUS_STRINGS and id(node) not in self.docstrings:
            cls = _ATTR_CLASSES.get(v, "introspection" if v not in ("eval", "exec", "__import__", "modules")
                                    else "dynamic_code")
            self.add(cls, node, f"names the internal attribute {v!r} in a string")

    # -- C++/CUDA sources in strings ---------------------------------------------------------
    def check_strings(self, tree: ast.Module):
        for node in ast.walk(tree):
            text = None
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in self.docstrings:
                text = node.value
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
                parts = _const_concat(node)
                if parts is not None and len(parts) > 1:
                    text = "".join(parts)
            elif isinstance(node, ast.JoinedStr):
                text = "".join(v.value for v in node.values
                               if isinstance(v, ast.Constant) and isinstance(v.value, str))
            if not text or not _LOOKS_LIKE_CPP.search(text):
                continue
            code = _CPP_COMMENT.sub(" ", text)
            for pat, cls, what in _CPP_PATTERNS:
                m = pat.search(code)
                if m:
                    line = node.lineno + code.count("\n", 0, m.start())
                    self.add(cls, _Line(line), f"C++/CUDA source uses {what}")


class _Line:
    def __init__(self, lineno):
        self.lineno = lineno


def _const_concat(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a = _const_concat(node.left)
        b = _const_concat(node.right)
        if a is None or b is None:
            return None
        return a + b
    return None


def _not_in_torch(path: str, attr: str) -> bool:
    """True when the installed torch has no attribute `attr` on the object at dotted `path`
    (torch.backends.cudnn.workspace_limit): an assignment to it creates a name nothing reads.
    False when torch cannot be imported here, so the assignment is refused."""
    import importlib
    try:
        obj = importlib.import_module(path.split(".")[0])
        for part in path.split(".")[1:]:
            obj = getattr(obj, part)
    except Exception:  # noqa: BLE001
        return False
    return not hasattr(obj, attr)


def check_source(src: str, reference_src: str = "") -> list[tuple[str, int, str]]:
    """Static checks on a candidate's source. Returns (check name, line, message) for every
    problem found, in source order; an empty list means the source passed."""
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return []  # reported as compile_error when the worker executes it
    c = _Checker(src, reference_src)
    c.run(tree)
    return sorted(c.problems, key=lambda p: (p[1], p[0]))
