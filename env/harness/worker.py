#!/usr/bin/env python3
"""crucible evaluator worker: evaluates ONE candidate kernel, then exits.

Started by the C++ evaluator (env/sandbox.cpp) as

    PYTHON -I -B env/harness/worker.py --endpoint ipc://SCRATCH/worker.sock \
        --device cpu|cuda --scratch SCRATCH

and driven over a ZeroMQ PAIR socket (the evaluator binds, this process connects) exactly as
docs/evaluator-protocol.md describes. See env/harness/README.md for the checks.

Trust model. Everything this process does after the candidate's code has run is suspect, so:
  * every function the harness needs for timing, synchronisation, copying outputs, counting
    threads and talking to the evaluator is captured into a local reference below, at import
    time, before any candidate code exists (the C-level functions where torch has them, e.g.
    torch._C._cuda_synchronize rather than torch.cuda.synchronize);
  * an integrity snapshot (identity of the attributes of torch, torch.nn.functional,
    torch.Tensor, torch.cuda, torch.backends.*, time, builtins, this module's globals,
    zmq.Socket, ...) is taken just before the candidate module executes and verified after it
    executes and after every candidate call ("runtime:patched"); a wider snapshot (every torch
    module loaded) is verified after loading and at the end;
  * process-wide settings (TF32, matmul precision, cudnn, thread counts, grad mode, torch
    function/dispatch modes, global module hooks, trace/profile functions) are fixed before the
    candidate runs and verified after every call ("runtime:backend_flags");
  * output comparison happens in the evaluator's process, on raw bytes sent from here or, on
    CUDA, on device copies of the outputs it maps from here (CUDA IPC) and compares with its
    own kernel.
"""
import os
import sys


def _set_harness_env():
    """Settings that must be in place before torch and triton are imported (and again in a
    forked worker, whose environment is replaced)."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no compile worker pools/threads
    os.environ["TRITON_F32_DEFAULT"] = "ieee"  # tl.dot on float32 is IEEE, like torch with TF32 off


_set_harness_env()

import argparse  # noqa: E402
import base64  # noqa: E402
import builtins  # noqa: E402
import copy  # noqa: E402
import ctypes  # noqa: E402
import fcntl  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import operator  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import types  # noqa: E402
import warnings  # noqa: E402

import numpy  # noqa: E402
import zmq  # noqa: E402
import torch  # noqa: E402
import torch.autograd.profiler  # noqa: E402
import torch.autograd.profiler_util  # noqa: E402
import torch.nn  # noqa: E402
import torch.nn.functional  # noqa: E402
import torch.nn.modules.module  # noqa: E402
import torch.profiler  # noqa: E402


def _prewarm_dynamo():
    """torch.compile monkey-patches torch the first time it is used (torch.manual_seed,
    nn.Module.__init__/__setstate__, torch.jit.trace, optimizers). Apply those patches now, so a
    candidate that legitimately uses torch.compile does not look like it patched torch."""
    try:
        import torch._dynamo  # noqa: F401  (wraps torch.manual_seed)
        from torch._dynamo.eval_frame import TorchPatcher
        from torch._dynamo.mutation_guard import install_generation_tagging_init
        TorchPatcher.patch()
        install_generation_tagging_init()
    except Exception:  # an older or newer torch without these: the snapshot will tell
        pass
    # Inductor creates tqdm progress bars (disabled ones too); every tqdm instance starts tqdm's
    # monitor thread, which a candidate using torch.compile would then seem to have started.
    tq = sys.modules.get("tqdm.std")
    if tq is not None and hasattr(tq, "tqdm"):
        tq.tqdm.monitor_interval = 0


_prewarm_dynamo()


class _FlockBaton:
    """torch.utils.cpp_extension's FileBaton (the lock around an extension's build) on flock(2).
    torch's own creates `lock` and removes it when the build ends, so a build killed by a
    deadline left the file behind, and every later build in that directory waited for it until
    its own deadline. A flock is released by the kernel when its holder dies; the file stays and
    means nothing by itself."""

    def __init__(self, lock_file_path, wait_seconds=0.1, warn_after_seconds=None):
        self.lock_file_path = lock_file_path
        self.fd = None

    def try_acquire(self):
        fd = os.open(self.lock_file_path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def wait(self):
        """Until the build in progress ends, or its process dies."""
        fd = os.open(self.lock_file_path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        finally:
            os.close(fd)

    def release(self):
        if self.fd is not None:
            os.close(self.fd)  # releases the flock
            self.fd = None


# The evaluator's build service, set while the candidate's module executes (Worker.load_phase):
# a function that sends a build request and returns the evaluator's reply. None: builds are made
# here, in the worker's own scratch directory (TORCH_EXTENSIONS_DIR).
_BUILD_SERVICE = None
# Environment variables a build reads from the candidate's process, sent with its request.
_BUILD_ENV = ("TORCH_CUDA_ARCH_LIST", "TORCH_NVCC_FLAGS")


def _build_request(fn_name, bound, files):
    """The evaluator's build request for a load_inline (or load, files=True) call, or None
    where the call names something only this worker can see (a path in its scratch directory
    other than load's sources) or an argument JSON cannot carry: such a build is made here."""
    args = {}
    for key, value in bound.arguments.items():
        if key in ("build_directory", "verbose"):
            continue
        if files and key == "sources":
            texts = []
            for path in [value] if isinstance(value, str) else list(value or ()):
                try:
                    with open(path, "r", encoding="utf-8") as f:
                        texts.append({"name": os.path.basename(path), "text": f.read()})
                except (OSError, UnicodeDecodeError, TypeError):
                    return None
            value = texts
        elif key == "extra_include_paths" and value:
            return None  # headers of its own: only this worker sees them
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return None
        args[key] = value
    env = {k: os.environ[k] for k in _BUILD_ENV if k in os.environ}
    if "TORCH_CUDA_ARCH_LIST" not in env and torch.cuda.is_initialized():
        major, minor = torch.cuda.get_device_capability()
        env["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    return {"type": "build", "fn": fn_name, "args": args, "env": env}


def _keyed_build(fn, files):
    """Wraps torch.utils.cpp_extension.load_inline (or load, files=True). While the candidate's
    module executes, a call without a build_directory of its own is built by the evaluator in a
    sandboxed builder process and kept in the evaluator's extension cache, keyed by the whole
    request (sources, functions, flags, name, build environment); this worker only imports the
    result, read-only. No worker can write what another candidate will load. Other calls build
    here, in the worker's own scratch directory."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def build(*args, **kwargs):
        service = _BUILD_SERVICE
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            return fn(*args, **kwargs)  # torch reports the bad call itself
        if service is None or bound.arguments.get("build_directory"):
            return fn(*args, **kwargs)
        bound.apply_defaults()
        req = _build_request("load" if files else "load_inline", bound, files)
        if req is None:
            return fn(*args, **kwargs)
        name = str(bound.arguments.get("name"))
        reply = service(req)
        if reply.get("type") != "built":
            raise RuntimeError(f"Error building extension '{name}': {reply.get('log', 'the build service failed')}")
        return sys.modules["torch.utils.cpp_extension"]._import_module_from_library(
            name, reply["dir"], bound.arguments.get("is_python_module", True))

    build._crucible_keyed = True
    build._crucible_original = fn
    return build


def build_extension(req, scratch):
    """A builder's job (the evaluator's build service): builds the request with torch's own
    load_inline or load in `scratch`, and returns the built library's bytes. Runs in a worker's
    sandbox that has never run candidate code and never touches the device."""
    import torch.utils.cpp_extension as ce
    os.environ.update({str(k): str(v) for k, v in (req.get("env") or {}).items()})
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the architecture comes with the request
    args = dict(req["args"])
    name = str(args.get("name", ""))
    if not name.isidentifier():
        raise ValueError(f"the extension's name {name!r} is not a Python identifier")
    build_dir = os.path.join(scratch, "build")
    os.makedirs(build_dir, exist_ok=True)
    fn = getattr(ce, "load" if req.get("fn") == "load" else "load_inline")
    fn = getattr(fn, "_crucible_original", fn)
    if req.get("fn") == "load":
        paths = []
        for i, src in enumerate(args.get("sources") or ()):
            base = os.path.basename(str(src.get("name", ""))) or f"source{i}.cpp"
            path = os.path.join(scratch, "sources", f"{i}_{base}")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(str(src.get("text", "")))
            paths.append(path)
        args["sources"] = paths
    fn(**args, build_directory=build_dir, verbose=False)
    with open(os.path.join(build_dir, name + ".so"), "rb") as f:
        return f.read()


# The build service for Triton, set when the worker starts and kept for its life (Triton compiles
# at a kernel's first launch, in the trials or the timing; the evaluator answers in any phase): a
# function that sends a build request and returns the evaluator's reply. None: Triton builds
# here, in the worker's own scratch directory (TRITON_CACHE_DIR), as it does by itself.
_TRITON_SERVICE = None
# The worker's scratch directory as it appears in the paths of a kernel's IR locations; taken out
# of the request, so that workers (each with a scratch of its own) share a kernel's build.
_TRITON_SCRATCH = None


def _triton_built(reply, what):
    if reply.get("type") != "built":
        raise RuntimeError(f"Triton could not build {what}: {reply.get('log', 'the build service failed')}")
    return reply["dir"]


def _triton_cc(name, src, srcdir, library_dirs, include_dirs, libraries):
    """triton.knobs.build.impl: Triton's C modules (its driver's cuda_utils, each kernel
    signature's launcher) are compiled by the evaluator's build service, which keeps them; this
    worker loads its copy. Without the service, Triton's own compiler call, here."""
    service = _TRITON_SERVICE
    if service is None:
        import triton
        from triton.runtime import build
        saved, triton.knobs.build.impl = triton.knobs.build.impl, None
        try:
            return build._build(name, src, srcdir, library_dirs, include_dirs, libraries, [])
        finally:
            triton.knobs.build.impl = saved
    with open(src, "r", encoding="utf-8") as f:
        text = f.read()
    args = {"name": name, "source": text, "library_dirs": list(library_dirs), "include_dirs": list(include_dirs),
            "libraries": list(libraries)}
    reply = service({"type": "build", "fn": "triton_cc", "args": args, "env": {}})
    return os.path.join(_triton_built(reply, f"its module {name}"), name + ".so")


def _triton_context(backend):
    """An MLIR context with Triton's dialects and the backend's loaded, as triton.compile makes."""
    from triton._C.libtriton import ir
    ctx = ir.context()
    ir.load_dialects(ctx)
    backend.load_dialects(ctx)
    return ctx


def _triton_request(src, target, options, env_vars):
    """(request, local cache manager, kernel file name, hash) for a Triton kernel's compile, or
    None where it compiles here: a source other than a Triton function (Gluon, IR files), a
    knob that dumps, overrides or inspects stages, a kernel already in this worker's cache, or
    anything JSON cannot carry. The request holds the kernel's first IR (TTIR, made here from the
    candidate's Python, which only this process may run): the builder lowers it to a binary."""
    import triton
    from triton.backends.compiler import Language
    from triton.compiler import compiler as tc
    from triton.runtime.cache import get_cache_key, get_cache_manager
    knobs = triton.knobs
    if type(src) is not tc.ASTSource or src.language != Language.TRITON:
        return None
    if (knobs.compilation.always_compile or knobs.compilation.override or knobs.compilation.dump_ir
            or knobs.runtime.add_stages_inspection_hook is not None):
        return None
    if target is None:
        target = triton.runtime.driver.active.get_current_target()
    backend = tc.make_backend(target)
    opts = backend.parse_options(dict(options or {}, **src.parse_options()))
    env_vars = tc.get_cache_invalidating_env_vars() if env_vars is None else env_vars
    key_hash = hashlib.sha256(get_cache_key(src, backend, opts, env_vars=env_vars).encode("utf-8")).hexdigest()
    file_name = src.name[:150]
    cache = get_cache_manager(key_hash)
    if cache.get_group(f"{file_name}.json"):
        return None
    ctx = _triton_context(backend)
    module = src.make_ir(target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), ctx)
    ttir = str(module)
    if _TRITON_SCRATCH:
        ttir = ttir.replace('"' + os.path.join(_TRITON_SCRATCH, ""), '"')
    args = {"name": "kernel", "kernel": file_name, "ttir": ttir,
            "target": [target.backend, target.arch, target.warp_size], "options": dict(opts.__dict__),
            "env_vars": dict(env_vars)}
    json.dumps(args)
    return {"type": "build", "fn": "triton_kernel", "args": args, "env": {}}, cache, file_name, key_hash


def _triton_compile(orig):
    """Wraps triton.compile: with the build service, a kernel's binary is built by the
    evaluator (keyed by its TTIR, options, target and Triton's build environment; kept in the
    extension cache, which only the evaluator writes), put in this worker's own Triton cache,
    and loaded from there by Triton's compile as a cache hit."""

    @functools.wraps(orig)
    def compile(src, target=None, options=None, _env_vars=None):
        service = _TRITON_SERVICE
        made = None
        if service is not None:
            try:
                made = _triton_request(src, target, options, _env_vars)
            except Exception:  # the front end's own error: Triton's compile reports it itself
                made = None
        if made is not None:
            req, cache, file_name, key_hash = made
            d = _triton_built(service(req), f"the kernel {file_name}")
            with open(os.path.join(d, "kernel.json"), "r", encoding="utf-8") as f:
                files = json.load(f)["files"]
            group = {}
            for fname, item in files.items():
                data = item["text"] if "text" in item else base64.b64decode(item["base64"])
                if fname == f"{file_name}.json":
                    meta = json.loads(data)
                    meta["hash"] = key_hash
                    data = json.dumps(meta)
                group[fname] = cache.put(data, fname, binary=isinstance(data, bytes))
            cache.put_group(f"{file_name}.json", group)
        return orig(src, target=target, options=options, _env_vars=_env_vars)

    compile._crucible_keyed = True
    compile._crucible_original = orig
    return compile


def _install_triton_hooks():
    import triton
    import triton.compiler
    import triton.compiler.compiler as tc
    triton.knobs.build.impl = _triton_cc
    if not getattr(tc.compile, "_crucible_keyed", False):
        keyed = _triton_compile(tc.compile)
        tc.compile = keyed
        triton.compiler.compile = keyed
        triton.compile = keyed


def build_triton(req, scratch):
    """A builder's job for Triton (the build service): `triton_cc` compiles one of Triton's C
    modules with Triton's own compiler call; `triton_kernel` lowers a kernel's TTIR through
    Triton's stages for the request's target, as triton.compile does after its front end, and
    returns every stage's file as JSON."""
    import triton
    from triton.runtime import build
    args = req["args"]
    name = str(args["name"])
    os.makedirs(scratch, exist_ok=True)
    if req.get("fn") == "triton_cc":
        path = os.path.join(scratch, name + ".c")
        with open(path, "w", encoding="utf-8") as f:
            f.write(str(args["source"]))
        triton.knobs.build.impl = None
        so = build._build(name, path, scratch, [str(x) for x in args.get("library_dirs") or ()],
                          [str(x) for x in args.get("include_dirs") or ()],
                          [str(x) for x in args.get("libraries") or ()], [])
        with open(so, "rb") as f:
            return f.read()
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget, Language
    from triton.compiler import compiler as tc
    os.environ.update({str(k): str(v) for k, v in (args.get("env_vars") or {}).items()})

    def tupled(v):
        return tuple(tupled(x) for x in v) if isinstance(v, list) else v

    backend_name, arch, warp_size = args["target"]
    target = GPUTarget(str(backend_name), arch if isinstance(arch, str) else int(arch), int(warp_size))
    backend = tc.make_backend(target)
    opts = backend.parse_options({str(k): tupled(v) for k, v in dict(args["options"]).items()})
    file_name = str(args["kernel"])[:150]
    ctx = _triton_context(backend)
    path = os.path.join(scratch, "kernel.ttir")
    with open(path, "w", encoding="utf-8") as f:
        f.write(str(args["ttir"]))
    module = ir.parse_mlir_module(path, ctx)
    module.context = ctx
    metadata = {"hash": "", "target": target, **opts.__dict__, **dict(args.get("env_vars") or {}),
                "triton_version": triton.__version__}
    stages = {}
    backend.add_stages(stages, opts, Language.TRITON)
    files = {f"{file_name}.source": {"text": str(args["ttir"])}}
    for ext, lower in stages.items():
        module = lower(module, metadata)
        files[f"{file_name}.{ext}"] = ({"base64": base64.b64encode(module).decode("ascii")} if isinstance(module, bytes)
                                       else {"text": str(module)})
    files[f"{file_name}.json"] = {"text": json.dumps(metadata, default=vars)}
    return json.dumps({"files": files}).encode("utf-8")


def _install_cpp_extension_hooks(module):
    module.FileBaton = _FlockBaton
    for name, files in (("load_inline", False), ("load", True)):
        fn = getattr(module, name, None)
        if fn is not None and not getattr(fn, "_crucible_keyed", False):
            setattr(module, name, _keyed_build(fn, files))


def _prewarm_cpp_extension():
    """Imports torch.utils.cpp_extension, which brings in setuptools, pkg_resources and
    pyparsing: 0.54 s of a 0.62 s import of a candidate whose load_inline extension was already
    built (development machine, cProfile of the import). Its import asks
    torch.cuda.is_available(), which would initialise CUDA in the zygote and stop it forking;
    with PYTORCH_NVML_BASED_CUDA_CHECK=1, set only around the import, NVML answers instead.
    Its warning that no CUDA runtime is found (on a machine without a GPU) is kept quiet."""
    if "torch.utils.cpp_extension" in sys.modules:
        _install_cpp_extension_hooks(sys.modules["torch.utils.cpp_extension"])
        return
    saved = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    log.setLevel(logging.ERROR)
    try:
        import torch.utils.cpp_extension  # noqa: F401
        _install_cpp_extension_hooks(torch.utils.cpp_extension)
    except Exception:  # its first use pays the import, as before
        pass
    finally:
        log.setLevel(level)
        if saved is None:
            os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
        else:
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = saved


def _prewarm_triton():
    """Host-only work a Triton kernel's first launch does once per process: hashing Triton's
    own files into its cache key (triton.runtime.cache.triton_key, kept by lru_cache) and
    importing triton.experimental.gluon. On an H100's host that was ~0.75 s of a Triton
    candidate's first call (tools/bench/first_call_probe.py). Done in the zygote, before any
    fork, it is paid once per evaluator; it touches no CUDA driver. CUDA workers only. Also
    puts Triton's builds on the evaluator's build service (_install_triton_hooks)."""
    try:
        from triton.runtime.cache import triton_key
        triton_key()
        import triton.experimental.gluon  # noqa: F401
        _install_triton_hooks()
    except Exception:  # no Triton, or another version: its first launch pays as before
        pass


def _prewarm(cuda):
    """The zygote's warm-ups, before it forks (a worker started as its own interpreter makes
    them before it says `started`; in a forked one they are already done)."""
    _prewarm_cpp_extension()
    if cuda:
        _prewarm_triton()

# ================================================================================================
# Trusted references, captured before any candidate code exists.

_type = type
_isinstance = isinstance
_len = len
_all = all
_map = map
_is = operator.is_
_getattr = getattr
_hasattr = hasattr
_callable = callable
_list = list
_tuple = tuple
_dict = dict
_str = str
_int = int
_float = float
_round = round
_bool = bool
_range = range
_repr = repr
_min = min
_max = max
_sum = sum
_set = set
_abs = abs
_sorted = sorted
_vars = vars
_BaseException = BaseException
_Exception = Exception
_MemoryError = MemoryError
_OSError = OSError
_ModuleType = types.ModuleType

_perf_counter_ns = time.perf_counter_ns
_clock_gettime_ns = time.clock_gettime_ns
_get_native_id = threading.get_native_id
_json_dumps = json.dumps
_json_loads = json.loads
_os_exit = os._exit
_os_listdir = os.listdir
_os_getppid = os.getppid
_os_getpid = os.getpid
_active_count = threading.active_count
_enumerate_threads = threading.enumerate
_enumerate = enumerate
_current_frames = sys._current_frames
_setprofile = sys.setprofile
_gettrace = sys.gettrace
_getprofile = sys.getprofile
_sys_modules = sys.modules
_format_exception = traceback.format_exception
_format_exception_only = traceback.format_exception_only
_TracebackException = traceback.TracebackException
_StackSummary = traceback.StackSummary
_signature = inspect.signature
_param_empty = inspect.Parameter.empty
_param_positional_only = inspect.Parameter.POSITIONAL_ONLY
_param_positional_or_keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
_Random = random.Random
_random_seed = random.seed
_np_seed = numpy.random.seed
_urandom = os.urandom
_int_from_bytes = int.from_bytes


def _fresh_seed():
    """63 bits from the operating system: a seed no process state predicts."""
    return _int_from_bytes(_urandom(8), "little") >> 1


def _reseed_visible():
    """Sets every random generator a candidate can see (torch's default ones on every device,
    Python's random, numpy's) to a fresh state from the operating system, before each of its
    calls and before its module executes: the state left by drawing inputs says nothing of the
    inputs to come, and reading it tells a checked call from a timed one by nothing."""
    _torch_manual_seed(_fresh_seed())
    _random_seed(_fresh_seed())
    _np_seed(_fresh_seed() & 0xFFFFFFFF)
_gc_freeze = gc.freeze
_gc_disable = gc.disable
_gc_enable = gc.enable
_gc_isenabled = gc.isenabled

_Tensor = torch.Tensor
_T_detach = torch.Tensor.detach
_T_cpu = torch.Tensor.cpu
_T_contiguous = torch.Tensor.contiguous
_T_reshape = torch.Tensor.reshape
_T_view = torch.Tensor.view
_T_numpy = torch.Tensor.numpy
_T_clone = torch.Tensor.clone
_T_zero_ = torch.Tensor.zero_
_T_is_contiguous = torch.Tensor.is_contiguous
_T_copy_ = torch.Tensor.copy_
_T_fill_ = torch.Tensor.fill_
_T_set_ = torch.Tensor.set_
_T_untyped_storage = torch.Tensor.untyped_storage
_T_is_floating_point = torch.Tensor.is_floating_point
_T_stride = torch.Tensor.stride
_T_storage_offset = torch.Tensor.storage_offset
_T_size = torch.Tensor.size
_T_mul = torch.Tensor.mul
_T_lt = torch.Tensor.lt
_torch_where = torch.where
_torch_isfinite = torch.isfinite
_torch_abs = torch.abs
_torch_isnan = torch.isnan
_torch_arange = torch.arange
_T_all = torch.Tensor.all
_T_to = torch.Tensor.to
_T_uniform_ = torch.Tensor.uniform_
_T_data_ptr = torch.Tensor.data_ptr
_T_numel = torch.Tensor.numel
_S_data_ptr = torch.UntypedStorage.data_ptr
_nd_tobytes = numpy.ndarray.tobytes
_torch_empty = torch.empty
_torch_manual_seed = torch.manual_seed
_torch_equal = torch.equal
_torch_sum = torch.sum
_torch_device = torch.device
_torch_randint = torch.randint
_torch_index_select = torch.index_select
_torch_stack = torch.stack
_torch_isclose = torch.isclose
_torch_eq = torch.eq
_torch_count_nonzero = torch.count_nonzero
_T_tolist = torch.Tensor.tolist
_T_item = torch.Tensor.item
_Generator = torch.Generator
_uint8 = torch.uint8
_int32 = torch.int32
_int64 = torch.int64
_strided = torch.strided
_set_grad_enabled = torch._C._set_grad_enabled
_OutOfMemoryError = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)

_profile = torch.profiler.profile
_ProfilerActivity = torch.profiler.ProfilerActivity
_DeviceType = torch.autograd.DeviceType

_cuda_synchronize = torch._C._cuda_synchronize
_cuda_empty_cache = torch.cuda.empty_cache
_cuda_sleep = getattr(torch._C, "_cuda_sleep", None)
# Device-side spin queued after the cache flush, before the start event: ~100 us at 2 GHz. The
# host launches the timed call while the device is still busy with the flush and the spin, so
# the start event is passed when the call's first kernel can start: the host's launch latency
# (10-40 us, varying from process to process) stays out of the stream time.
_LAUNCH_COVER_CYCLES = 200_000
# Clock warm-up (Worker.clock_warmup): spins per timed batch, and the least time spent spinning.
_CLOCK_BATCH = 40
_CLOCK_MIN_MS = 20.0
# Elements of each output compared in every timing round (check_round_outputs).
_ROUND_SAMPLE = 1 << 16
# Elements of each output snapshotted inside a timed sample, after every call but the last
# (_call_all): enough to catch a call that left its outputs unwritten or unfinished, few enough
# that the gather, which both samples hold, adds little to a 10 us call.
_INSIDE_SAMPLE = 1 << 12
# How long the gate before a timed sample (Worker.begin_sample) waits at most for the host to
# queue the sample's calls: 2e8 SM cycles, 100 ms at 2 GHz; a forward that waits for the device
# inside the sample waits this long. choose_calls keeps a sample's host time, as the first calls
# measured it, under _GATE_HOST_MS: a tenth of the wait, so that a host slower in the rounds than
# in the first calls still queues the sample in time. With a 20 ms wait and half of it as the
# target, one H100 verdict in two of a 38 us kernel (L2_T51 of dev6) had 1-5 samples time out
# (the host took 0.34 ms a call in the first calls and ~0.5 ms in the rounds), timed at the
# host's pace, and two of ten ended "unstable after max_rounds".
_GATE_CYCLES = 200_000_000
_GATE_MS = 100.0
_GATE_HOST_MS = 10.0
# How long the profiled call of trial 0 stays under the profiler after its stop event
# (Worker.profiled, check_device_time).
_LATE_WORK_NS = 2_000_000
# Mismatch counters on the device for the round output checks read at once (check_round_fracs).
_ROUND_SLOTS = 1024
_EventBase = torch._C._CudaEventBase
_Ev_record = torch._C._CudaEventBase.record
_Ev_synchronize = torch._C._CudaEventBase.synchronize
_Ev_elapsed = torch._C._CudaEventBase.elapsed_time

_ZSocketBase = zmq.Socket.__mro__[1]  # the Cython socket under zmq.sugar.socket.Socket
_z_send = _ZSocketBase.send
_z_recv = _ZSocketBase.recv
_z_get = _ZSocketBase.get
_z_set = _ZSocketBase.set
_z_close = _ZSocketBase.close
_ZAgain = zmq.Again
_ZMQError = zmq.ZMQError
_SNDMORE = zmq.SNDMORE
_RCVMORE = zmq.RCVMORE
_LINGER = zmq.LINGER
_RCVTIMEO = zmq.RCVTIMEO
_NOBLOCK = zmq.NOBLOCK
_SNDTIMEO = zmq.SNDTIMEO

_SUPPORTED_DTYPES = {
    torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
    torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
}

_MISSING = object()


def _load_driver_ipc():
    """cuIpcGetMemHandle and cuMemGetAddressRange from the CUDA driver, or None (no driver)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        get_handle = lib.cuIpcGetMemHandle
        get_handle.argtypes = (ctypes.c_void_p, ctypes.c_uint64)
        get_handle.restype = ctypes.c_int
        get_range = lib.cuMemGetAddressRange_v2
        get_range.argtypes = (ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64)
        get_range.restype = ctypes.c_int
        return get_handle, get_range
    except (OSError, AttributeError):
        return None


class _HarnessKernels:
    """The harness's own device operations (env/harness/harness_kernels.cu), from the fatbin the
    build makes, loaded with cuModuleLoadData and launched with cuLaunchKernel on torch's current
    stream. torch's operations for the same work (the flush's sum, the spin, randint,
    index_select, isclose, equal, the float64 scale, uniform_ and mul) load lazily at their first
    launch in each worker: 156-180 ms in all on an H100 against 0.4-0.7 ms for this module
    (tools/bench/lazy_load_probe.py). Without the fatbin the worker uses those torch operations."""

    _FLOAT = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16"}
    _BITS = {1: "b1", 2: "b2", 4: "b4", 8: "b8"}
    _THREADS = 256

    def __init__(self, image):
        lib = ctypes.CDLL("libcuda.so.1")
        self._launch = lib.cuLaunchKernel
        self._launch.argtypes = (ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                 ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p,
                                 ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
        self._launch.restype = ctypes.c_int
        self._memset = lib.cuMemsetD8Async
        self._memset.argtypes = (ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p)
        self._memset.restype = ctypes.c_int
        self._error_string = lib.cuGetErrorString
        self._error_string.argtypes = (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
        self._error_string.restype = ctypes.c_int
        module = ctypes.c_void_p()
        self._check(lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(image)), "loading the harness kernels")
        self._module = module
        self._fn = {}
        names = ["crucible_flush", "crucible_spin", "crucible_gate", "crucible_bytes_differ"]
        names += [f"crucible_{k}_{s}" for s in self._FLOAT.values()
                  for k in ("round_check", "scale_uniform", "scale_signed")]
        names += [f"crucible_{k}_{s}" for s in self._BITS.values() for k in ("round_check", "gather")]
        for name in names:
            fn = ctypes.c_void_p()
            self._check(lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), f"finding {name}")
            self._fn[name] = fn
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self._blocks = 8 * props.multi_processor_count
        # The gate (gate_close): 1024-thread blocks enough to fill every SM's thread slots.
        per_sm = _int(_getattr(props, "max_threads_per_multi_processor", 2048) or 2048)
        self._gate_blocks = props.multi_processor_count * _max(1, per_sm // 1024)
        # Its two words in mapped host memory: [0] open, written by the host; [1] timed out,
        # written by the gate. CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP.
        host = _c_void_p()
        self._check(lib.cuMemHostAlloc(_c_byref(host), ctypes.c_size_t(8), ctypes.c_uint(0x01 | 0x02)),
                    "cuMemHostAlloc (the gate's flags)")
        dev = ctypes.c_uint64()
        self._check(lib.cuMemHostGetDevicePointer_v2(_c_byref(dev), host, ctypes.c_uint(0)),
                    "cuMemHostGetDevicePointer (the gate's flags)")
        self._gate_words = (ctypes.c_uint32 * 2).from_address(host.value)
        self._gate_words[0] = 1
        self._gate_words[1] = 0
        self._gate_dev = dev.value
        self._stream = torch.cuda.current_stream
        # Small results: [0] the flush's sink, [1] the bytes-differ flag (int32), [2] a float64 sum.
        self._scratch = torch.empty(3, dtype=torch.int64, device="cuda")
        self._scratch_ptr = self._scratch.data_ptr()
        self._zero(self._scratch_ptr, 24)

    def _check(self, rc, what):
        if rc != 0:
            s = _c_char_p()
            self._error_string(rc, _c_byref(s))
            raise RuntimeError(f"CUDA error: {(s.value or b'').decode(errors='replace')} (CUresult {rc}, {what})")

    def _go(self, name, n, *args):
        """Launches `name` over n elements (grid-stride, at most 8 blocks an SM); args are ctypes values."""
        self._start(name, _max(1, _min(self._blocks, (n + self._THREADS - 1) // self._THREADS)), self._THREADS, args)

    def _start(self, name, blocks, threads, args):
        params = (_c_void_p * _len(args))(*[_c_cast(_c_byref(a), _c_void_p) for a in args])
        stream = _c_void_p(self._stream().cuda_stream)
        self._check(self._launch(self._fn[name], blocks, 1, 1, threads, 1, 1, 0, stream, params, None), name)

    def _zero(self, ptr, nbytes):
        self._check(self._memset(ptr, 0, nbytes, _c_void_p(self._stream().cuda_stream)), "cuMemsetD8Async")

    def flush(self, buf):
        """Reads the flush buffer (an int32 tensor) once."""
        n16 = _T_numel(buf) * 4 // 16
        self._go("crucible_flush", n16, _c_void_p(_T_data_ptr(buf)), _c_int64(n16),
                 _c_void_p(self._scratch_ptr))

    def spin(self, cycles):
        """One thread spinning for `cycles` SM clock cycles."""
        self._start("crucible_spin", 1, 1, (_c_int64(cycles),))

    def gate_close(self, max_cycles):
        """Queues the gate (harness_kernels.cu, crucible_gate): from when it starts until
        gate_open() or `max_cycles` SM cycles later, no other kernel of this context runs, on
        any stream. The previous gate must have ended (the caller waited for the device)."""
        self._gate_words[0] = 0
        self._gate_words[1] = 0
        self._start("crucible_gate", self._gate_blocks, 1024,
                    (_c_void_p(self._gate_dev), _c_int64(_int(max_cycles)), _c_void_p(self._gate_dev + 4)))

    def gate_open(self):
        self._gate_words[0] = 1

    def gate_timed_out(self):
        """Whether the last gate stopped waiting before gate_open() (read after the device is waited for)."""
        return self._gate_words[1] != 0

    def bytes_differ(self, a, b):
        """True when two contiguous uint8 tensors of one size differ anywhere (waits for the device)."""
        n = _T_numel(a)
        pa, pb = _T_data_ptr(a), _T_data_ptr(b)
        flag = self._scratch_ptr + 8
        self._zero(flag, 4)
        self._go("crucible_bytes_differ", _max(n // 16, 1), _c_void_p(pa), _c_void_p(pb), _c_int64(n),
                 _c_int(1 if (pa % 16 == 0 and pb % 16 == 0) else 0), _c_void_p(flag))
        return _int(_T_item(_T_view(self._scratch[1:2], _int32)[0])) != 0

    def supports(self, t):
        return t.dtype in self._FLOAT or t.element_size() in self._BITS

    def gather(self, src, seed, samples):
        """A new 1-D tensor of src's dtype: src's elements at `samples` positions drawn from
        `seed` (all of them, in order, when src is smaller). src: contiguous."""
        n = _T_numel(src)
        taken = _torch_empty(_min(n, samples), dtype=src.dtype, device=src.device)
        self._go("crucible_gather_" + self._BITS[src.element_size()], _min(n, samples),
                 _c_void_p(_T_data_ptr(src)), _c_int64(n), _c_uint64(seed), _c_int64(samples),
                 _c_void_p(_T_data_ptr(taken)))
        return taken

    def round_check(self, ref, taken, seed, samples, atol, rtol, counter_ptr):
        """Adds to the uint64 at counter_ptr how many of `samples` positions drawn from `seed`
        (all of them when the output is smaller) differ: beyond atol + rtol * |ref| for floating
        outputs, in any bit otherwise. ref: contiguous; taken: the candidate's values at those
        positions (gather with the same seed), of ref's dtype."""
        n = _T_numel(ref)
        common = (_c_void_p(_T_data_ptr(ref)), _c_void_p(_T_data_ptr(taken)), _c_int64(n),
                  _c_uint64(seed), _c_int64(samples))
        suffix = self._FLOAT.get(ref.dtype)
        count = _min(n, samples)
        if suffix is not None:
            self._go("crucible_round_check_" + suffix, count, *common, _c_double(atol), _c_double(rtol),
                     _c_void_p(counter_ptr))
        else:
            self._go("crucible_round_check_" + self._BITS[ref.element_size()], count, *common,
                     _c_void_p(counter_ptr))

    def scale_uniform(self, x, seed, signed=False):
        """A new tensor like the contiguous floating `x`, each element times U(0.5, 2) drawn from
        seed, with `signed` also a random sign (Worker.make_inputs, distribution 2)."""
        y = _torch_empty(_tuple(_T_size(x)), dtype=x.dtype, device=x.device)
        n = _T_numel(x)
        kind = "crucible_scale_signed_" if signed else "crucible_scale_uniform_"
        self._go(kind + self._FLOAT[x.dtype], n, _c_void_p(_T_data_ptr(x)),
                 _c_void_p(_T_data_ptr(y)), _c_int64(n), _c_uint64(seed))
        return y


# Loaded when a CUDA worker starts (Worker.start), not at import: a zygote (see zygote_main)
# imports this module and must not have touched the CUDA driver when it forks workers.
# _KERNELS_IMAGE: the fatbin's bytes, read at start-up (--kernels) before any candidate runs;
# _KERNELS: the module loaded from it, or None (torch operations instead).
_KERNELS_IMAGE = None
_KERNELS_ERROR = ""
_KERNELS = None
_DRIVER_IPC = None
_c_uint64 = ctypes.c_uint64
_c_int64 = ctypes.c_int64
_c_int = ctypes.c_int
_c_double = ctypes.c_double
_c_void_p = ctypes.c_void_p
_c_char_p = ctypes.c_char_p
_c_cast = ctypes.cast
_c_size_t = ctypes.c_size_t
_c_byref = ctypes.byref
_string_buffer = ctypes.create_string_buffer
_bytes_hex = bytes.hex


# Operators that compute nothing (views, metadata, allocation, reading a scalar): not evidence of
# a candidate's own work when they are all it adds to the reference's operators (own_work, CPU).
_NO_KERNEL_OPS = frozenset("aten::" + n for n in (
    "view", "view_as", "reshape", "_reshape_alias", "_unsafe_view", "flatten", "unflatten", "slice", "select",
    "narrow", "split", "split_with_sizes", "chunk", "unbind", "as_strided", "expand", "expand_as", "permute",
    "transpose", "t", "numpy_T", "unsqueeze", "squeeze", "contiguous", "detach", "alias", "lift_fresh",
    "empty", "empty_like", "empty_strided", "resize_", "item", "_local_scalar_dense", "size", "stride",
    "is_nonzero", "result_type", "to", "_to_copy", "numpy", "set_"))


def _getter(name):
    f = getattr(torch._C, name, None)
    return f if callable(f) else None


def _setter(name):
    f = _getter(name)
    if f is None:
        return None
    return lambda v: f(*v) if _isinstance(v, _tuple) else f(v)


# Backend settings a candidate may choose for itself: the worker applies its values around its
# calls only (Worker.candidate_flags), the reference runs under the harness's. Those that change
# the precision of arithmetic (TF32, reduced-precision reductions, fp32_precision) are judged
# by the outputs' error against the reference, like any other kernel's precision (docs/
# evaluator.md, Correctness). In the order they are applied: the legacy switches first, the
# fp32_precision settings (appended below), which they are derived from, last.
_CANDIDATE_FLAG_SETTERS = [(n, f) for n, f in [
    ("cuda.matmul.allow_tf32", _setter("_set_cublas_allow_tf32")),
    ("cudnn.allow_tf32", _setter("_set_cudnn_allow_tf32")),
    ("onednn.allow_tf32", _setter("_set_onednn_allow_tf32")),
    ("float32_matmul_precision", _setter("_set_float32_matmul_precision")),
    ("cudnn.benchmark", _setter("_set_cudnn_benchmark")),
    ("cudnn.deterministic", _setter("_set_cudnn_deterministic")),
    ("cudnn.enabled", _setter("_set_cudnn_enabled")),
    ("mkldnn.enabled", _setter("_set_mkldnn_enabled")),
    ("cuda.matmul.allow_fp16_reduced_precision_reduction",
     _setter("_set_cublas_allow_fp16_reduced_precision_reduction")),
    ("cuda.matmul.allow_bf16_reduced_precision_reduction",
     _setter("_set_cublas_allow_bf16_reduced_precision_reduction")),
    ("cuda.matmul.allow_fp16_accumulation", _setter("_set_cublas_allow_fp16_accumulation")),
    ("cpu.allow_fp16_reduced_precision_reduction", _setter("_set_cpu_allow_fp16_reduced_precision_reduction")),
    ("cuda.preferred_blas_library", _setter("_set_blas_preferred_backend")),
    ("sdp.flash", _setter("_set_sdp_use_flash")),
    ("sdp.mem_efficient", _setter("_set_sdp_use_mem_efficient")),
    ("sdp.math", _setter("_set_sdp_use_math")),
    ("sdp.cudnn", _setter("_set_sdp_use_cudnn")),
    ("sdp.math_fp16_bf16_reduction", _setter("_set_math_sdp_allow_fp16_bf16_reduction")),
] if f is not None]


# Process-wide settings that change speed or precision, read through captured getters.
_FLAG_GETTERS = [(n, g) for n, g in [
    ("cuda.matmul.allow_tf32", _getter("_get_cublas_allow_tf32")),
    ("cudnn.allow_tf32", _getter("_get_cudnn_allow_tf32")),
    ("onednn.allow_tf32", _getter("_get_onednn_allow_tf32")),
    ("float32_matmul_precision", _getter("_get_float32_matmul_precision")),
    ("cudnn.benchmark", _getter("_get_cudnn_benchmark")),
    ("cudnn.enabled", _getter("_get_cudnn_enabled")),
    ("cudnn.deterministic", _getter("_get_cudnn_deterministic")),
    ("deterministic_algorithms", _getter("_get_deterministic_algorithms")),
    ("mkldnn.enabled", _getter("_get_mkldnn_enabled")),
    ("cuda.matmul.allow_fp16_reduced_precision_reduction",
     _getter("_get_cublas_allow_fp16_reduced_precision_reduction")),
    ("cuda.matmul.allow_bf16_reduced_precision_reduction",
     _getter("_get_cublas_allow_bf16_reduced_precision_reduction")),
    ("cuda.matmul.allow_fp16_accumulation", _getter("_get_cublas_allow_fp16_accumulation")),
    ("cpu.allow_fp16_reduced_precision_reduction", _getter("_get_cpu_allow_fp16_reduced_precision_reduction")),
    ("cuda.preferred_blas_library", _getter("_get_blas_preferred_backend")),
    ("sdp.flash", _getter("_get_flash_sdp_enabled")),
    ("sdp.mem_efficient", _getter("_get_mem_efficient_sdp_enabled")),
    ("sdp.math", _getter("_get_math_sdp_enabled")),
    ("sdp.cudnn", _getter("_get_cudnn_sdp_enabled")),
    ("sdp.math_fp16_bf16_reduction", _getter("_get_math_sdp_allow_fp16_bf16_reduction")),
    ("num_threads", torch.get_num_threads),
    ("num_interop_threads", torch.get_num_interop_threads),
    ("default_dtype", torch.get_default_dtype),
    ("grad_enabled", torch.is_grad_enabled),
    ("torch_function_modes", _getter("_len_torch_function_stack")),
    ("torch_dispatch_modes", _getter("_len_torch_dispatch_stack")),
    ("sys.settrace", _gettrace),
    ("sys.setprofile", _getprofile),
] if g is not None]
_fp32_precision_getter = _getter("_get_fp32_precision_getter")
_fp32_precision_setter = _getter("_set_fp32_precision_setter")
for _b, _o in (("generic", "all"), ("cuda", "matmul"), ("cuda", "conv"), ("cuda", "rnn"),
               ("mkldnn", "matmul"), ("mkldnn", "conv"), ("mkldnn", "rnn")):
    if _fp32_precision_getter is not None:
        try:
            _fp32_precision_getter(_b, _o)
            _FLAG_GETTERS.append((f"fp32_precision.{_b}.{_o}",
                                  functools.partial(_fp32_precision_getter, _b, _o)))
            if _fp32_precision_setter is not None:
                _CANDIDATE_FLAG_SETTERS.append((f"fp32_precision.{_b}.{_o}",
                                                functools.partial(_fp32_precision_setter, _b, _o)))
        except Exception:
            pass
try:
    _default_device_getter = torch.get_default_device
    _FLAG_GETTERS.append(("default_device", lambda: str(_default_device_getter())))
except AttributeError:
    pass

# Global nn.Module hooks apply to the reference too: they must stay empty.
_MODULE_MODULE = torch.nn.modules.module
_GLOBAL_HOOK_DICTS = [(n, getattr(_MODULE_MODULE, n)) for n in dir(_MODULE_MODULE)
                      if n.startswith("_global_") and isinstance(getattr(_MODULE_MODULE, n), dict)]


# ================================================================================================
# Integrity snapshot.

_FLAGGABLE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType,
              type, types.MethodDescriptorType, types.WrapperDescriptorType,
              types.ClassMethodDescriptorType, types.GetSetDescriptorType,
              types.MemberDescriptorType, types.MethodWrapperType, classmethod, staticmethod,
              property, functools.partial)
_CLASS_IGNORE = {"__doc__", "__annotations__", "__slotnames__", "_abc_impl", "__abstractmethods__",
                 "__parameters__", "__weakref__", "__dict__", "__orig_bases__",
                 "__static_attributes__", "__firstlineno__", "_is_protocol"}
_ALL_IGNORE = {"_", "__warningregistry__"}
# Benign lazy registrations torch makes when its compiler is first used (full snapshot only).
_LAZY_REGISTRATIONS = ("torch.compiler._cache.CacheInfo.",)


def _flaggable(v):
    return _isinstance(v, _FLAGGABLE) or _callable(v)


def _dict_tag_views():
    """CPython 3.11-3.13 give every dict a version tag (PyDictObject.ma_version_tag, right after
    the object header and ma_used) that changes on every insertion, deletion and assignment of
    another value. Returns a function making a live view of a dict's tag, or None where the
    layout is not that one: a self-test changes a dict, a class and a module every way that
    matters and needs the tag to move each time; without it the snapshot compares identities
    only. Reading the tags of ~500 dicts touches ~500 objects; comparing their ~12,000 names
    and values by identity touched every one of those (each compare takes a reference) and
    took ~2.5 ms a call on an H100's host."""
    if sys.implementation.name != "cpython" or not ((3, 11) <= sys.version_info[:2] <= (3, 13)) \
            or _getattr(sys, "_is_gil_enabled", lambda: True)() is False:
        return None
    offset = 3 * ctypes.sizeof(ctypes.c_ssize_t)  # ob_refcnt, ob_type, ma_used

    def view(d):
        if _type(d) is not _dict:
            return None
        return _c_uint64.from_address(id(d) + offset)

    class _Probe:
        x = 1

    probe_mod = types.ModuleType("crucible_probe")
    probe_mod.x = 1
    try:
        for target in ({"x": 1}, _Probe, probe_mod):
            d = _proxied_dict(target if _type(target) is _dict else _vars(target))
            tag = view(d)
            if tag is None:
                return None
            seen = [tag.value]
            for change in ("assign", "insert", "delete"):
                if _type(target) is _dict:
                    if change == "delete":
                        del target["y"]
                    else:
                        target["x" if change == "assign" else "y"] = object()
                elif change == "delete":
                    delattr(target, "y")
                else:
                    setattr(target, "x" if change == "assign" else "y", object())
                if tag.value in seen:
                    return None
                seen.append(tag.value)
    except Exception:
        return None
    return view


def _proxied_dict(ns):
    """The dict behind a namespace: itself, or the dict a class's read-only proxy shows."""
    if _type(ns) is _dict:
        return ns
    inner = [r for r in gc.get_referents(ns) if _type(r) is _dict]
    return inner[0] if _len(inner) == 1 else None


def _unchanged(live, keys, values):
    """Fast path, at C speed: the same keys and values, by identity and in order. (No ==: a
    replaced value's __eq__ could be the candidate's.)"""
    return _len(live) == _len(keys) and _all(_map(_is, keys, live)) and _all(_map(_is, values, live.values()))


_DICT_TAG_VIEW = _dict_tag_views()
_tag_value = operator.attrgetter("value")


class _Snapshot:
    """Identity of attributes of modules and classes; `changed()` lists what differs.

    Modes: "all" (every name, any change), "public" (public names: any change; private names:
    changes involving functions, classes, modules or descriptors), "callables" (only changes
    involving those), "class" (like callables, plus added names that shadow something).

    Where dicts have version tags (_dict_tag_views), each entry also keeps a live view of its
    namespace's tag and the tag's value when the entry was last found unchanged: an entry
    whose tag has not moved since is skipped without looking at its names."""

    def __init__(self):
        self.entries = []
        self._seen = set()
        self.views = []      # per entry: a live view of its namespace dict's version tag, or None
        self.tags = []       # per entry: the tag's value when the entry last matched its snapshot
        self.all_viewed = True

    def _track(self, namespace):
        view = None
        if _DICT_TAG_VIEW is not None:
            try:
                d = _proxied_dict(namespace)
                view = _DICT_TAG_VIEW(d) if d is not None else None
            except _Exception:
                view = None
        self.views.append(view)
        self.tags.append(view.value if view is not None else None)
        self.all_viewed = self.all_viewed and view is not None

    def add_module(self, label, mod, mode):
        if mod is None or id(mod) in self._seen:
            return
        self._seen.add(id(mod))
        self.add_mapping(label, _vars(mod), mode)

    def add_mapping(self, label, live, mode):
        if id(live) in self._seen:
            return
        self._seen.add(id(live))
        frozen = _dict(live)
        self.entries.append((label, live, frozen, mode, _tuple(frozen), _tuple(frozen.values())))
        self._track(live)

    def add_class(self, cls, label=None):
        for c in cls.__mro__:
            if c is object or c is type or id(c) in self._seen:
                continue
            if c.__module__ == "builtins":
                continue  # static types: immutable
            self._seen.add(id(c))
            live = _vars(c)  # a live mappingproxy
            frozen = _dict(live)
            self.entries.append((label if c is cls and label else f"{c.__module__}.{c.__qualname__}",
                                 live, frozen, "class", _tuple(frozen), _tuple(frozen.values())))
            self._track(live)

    def add_classes_of(self, mod, prefixes):
        for name, v in _list(_vars(mod).items()):
            if _isinstance(v, type) and _isinstance(_getattr(v, "__module__", None), str) \
                    and v.__module__.startswith(prefixes):
                try:
                    self.add_class(v)
                except Exception:
                    pass

    def refresh(self):
        """Takes the present state of every entry as its snapshot; returns the labels of the
        entries that had changed. Only before any candidate code exists (a snapshot made ahead
        of the job, brought up to date when the candidate is about to load)."""
        out = []
        for i, (label, live, frozen, mode, keys, values) in enumerate(self.entries):
            view = self.views[i]
            if view is not None:
                self.tags[i] = view.value  # before the look: a change after it moves the tag
            if _unchanged(live, keys, values):
                continue
            frozen = _dict(live)
            self.entries[i] = (label, live, frozen, mode, _tuple(frozen), _tuple(frozen.values()))
            out.append(label)
        return out

    def changed(self, limit=20):
        views, tags = self.views, self.tags
        if self.all_viewed and _list(_map(_tag_value, views)) == tags:
            return []  # no namespace changed since it was last found unchanged
        out = []
        for i, (label, live, frozen, mode, keys, values) in enumerate(self.entries):
            view = views[i]
            tag = None
            if view is not None:
                tag = view.value
                if tag == tags[i]:
                    continue
            # Anything but _unchanged is looked at name by name below, where ignorable changes
            # are told apart.
            if _unchanged(live, keys, values):
                if tag is not None:
                    tags[i] = tag
                continue
            if label.startswith(_LAZY_REGISTRATIONS) or (label + ".").startswith(_LAZY_REGISTRATIONS):
                continue
            found = _len(out)
            for name, old in frozen.items():
                new = live.get(name, _MISSING)
                if new is old:
                    continue
                if mode == "all":
                    if name in _ALL_IGNORE:
                        continue
                elif mode == "class":
                    if name in _CLASS_IGNORE or not (_flaggable(old) or _flaggable(new)):
                        continue
                elif mode == "public" and not name.startswith("_"):
                    pass
                elif not (_flaggable(old) or (new is not _MISSING and _flaggable(new))):
                    continue
                out.append(f"{label}.{name}" + (" (deleted)" if new is _MISSING else ""))
                if _len(out) >= limit:
                    return out
            if mode in ("class", "all") and _len(live) != _len(frozen):
                for name in _list(live.keys()):
                    if name in frozen:
                        continue
                    if mode == "class" and (name in _CLASS_IGNORE or not _flaggable(live[name])):
                        continue
                    if mode == "all" and name in _ALL_IGNORE:
                        continue
                    out.append(f"{label}.{name} (added)")
                    if _len(out) >= limit:
                        return out
            if tag is not None and _len(out) == found:
                # Only ignorable changes: this state is the one to compare the tag with from
                # now on (the names are still compared with the snapshot when it moves again).
                tags[i] = tag
        return out


def _core_snapshot(harness_globals, s=None):
    """The modules and classes the harness and the reference rely on; checked after every call.
    With `s` (made earlier by this function), adds what was not loaded then."""
    s = s if s is not None else _Snapshot()
    s.add_module("builtins", builtins, "all")
    s.add_mapping("worker", harness_globals, "all")
    s.add_module("static_checks", _STATIC_CHECKS_MODULE, "all")
    for name in ("torch", "torch.nn", "torch.nn.functional", "torch.nn.modules.module",
                 "torch.nn.parameter", "torch.cuda", "torch.cuda.graphs", "torch.cuda.streams",
                 "torch.backends", "torch.profiler", "torch.profiler.profiler", "torch.autograd",
                 "torch.autograd.profiler", "torch.autograd.profiler_util", "torch.autograd.grad_mode",
                 "torch._tensor", "torch.random", "torch.storage", "torch.functional", "torch._C",
                 "torch._C._nn", "torch._C._VariableFunctions", "torch.compiler", "time",
                 "threading", "json", "json.encoder", "random", "inspect", "traceback", "zmq",
                 "zmq.sugar.socket", "numpy", "functools"):
        s.add_module(name, sys.modules.get(name), "public")
    for name, mod in _list(sys.modules.items()):
        if name.startswith("torch.backends.") and _isinstance(mod, _ModuleType):
            s.add_module(name, mod, "public")
    for name in ("sys", "os", "os.path"):
        s.add_module(name, sys.modules.get(name), "callables")
    for cls in (torch.Tensor, torch.nn.Module, torch.nn.Parameter, torch.UntypedStorage,
                torch.cuda.Event, torch.cuda.Stream, torch.cuda.CUDAGraph, torch.Generator,
                torch.profiler.profile, torch.autograd.profiler.profile,
                torch.autograd.profiler_util.FunctionEvent, torch.autograd.profiler_util.EventList,
                torch.no_grad, torch.enable_grad, zmq.Socket, zmq.Context, random.Random,
                json.JSONEncoder, json.JSONDecoder, numpy.ndarray, _Snapshot, _Done, Worker, Channel,
                _HarnessKernels):
        s.add_class(cls)
    for name in ("torch", "torch.nn", "torch.nn.functional", "torch.cuda", "torch.profiler",
                 "torch.autograd"):
        s.add_classes_of(sys.modules[name], ("torch",))
    return s


def _full_snapshot(s=None, changed=()):
    """Every torch (and zmq) module loaded at the time, with the classes they define; checked
    after the candidate module executes and at the end. (Not triton: it rebinds module
    attributes lazily when its driver is first used, and neither the harness nor the eager
    reference runs through it.) With `s` (made earlier by this function and refreshed, with the
    labels `changed` that refresh() returned), adds the modules loaded since and the classes
    new in changed modules."""
    fresh = s is None
    s = s if s is not None else _Snapshot()
    changed = set(changed)
    for name, mod in sorted(_list(sys.modules.items()), key=lambda kv: kv[0]):
        if not _isinstance(mod, _ModuleType):
            continue
        if name == "torch" or name.startswith(("torch.", "zmq")):
            if fresh or id(mod) not in s._seen or name in changed:
                s.add_module(name, mod, "callables")
                s.add_classes_of(mod, (name,))
    return s


def _snapshots(harness_globals, early=None):
    """(core, full) snapshots as the candidate is about to load; `early` is a pair made by this
    function ahead of the job (before any task or candidate code), brought up to date here."""
    if early is None:
        return _core_snapshot(harness_globals), _full_snapshot()
    core, full = early
    core.refresh()
    _core_snapshot(harness_globals, core)
    _full_snapshot(full, full.refresh())
    return core, full


# ================================================================================================
# Protocol plumbing.

class _Done(BaseException):
    """Ends the job with a `done` message."""

    def __init__(self, status, checks=(), message="", laps=None):
        super().__init__(message)
        self.status = status
        self.checks = _list(checks)
        self.message = message
        self.laps = laps


def _tail(text, lines=30, chars=4000):
    ls = text.rstrip().splitlines()
    out = "\n".join(ls[-lines:])
    return out[-chars:]


_THIS_FILE = os.path.realpath(__file__)
_MODULE_PY = os.path.join("torch", "nn", "modules", "module.py")


def _harness_frame(filename):
    return filename.endswith(_MODULE_PY) or os.path.realpath(filename) == _THIS_FILE


def _exc_text(e, lines=25):
    """The traceback's last lines, without the harness's own frames and nn.Module's call wrappers."""
    try:
        te = _TracebackException(_type(e), e, e.__traceback__)
        te.stack = _StackSummary.from_list(
            [f for f in te.stack if not _harness_frame(f.filename)])
        return _tail("".join(te.format()), lines)
    except Exception:
        try:
            return _tail("".join(_format_exception(_type(e), e, e.__traceback__)), lines)
        except Exception:
            return _repr(e)


def _exc_line(e):
    try:
        return "".join(_format_exception_only(_type(e), e)).strip()[-2000:]
    except Exception:
        return _repr(e)


def _is_oom(e):
    if _isinstance(e, (_MemoryError, _OutOfMemoryError)):
        return True
    s = _str(e)
    # torch's caching allocator, out of memory, reports which processes hold the device through
    # NVML; in the sandbox NVML cannot start, and the report fails with this assertion instead of
    # the OutOfMemoryError (CUDACachingAllocator.cpp, reportProcessMemoryInfo; torch 2.11).
    nvml = "nvmlInit" in s and "CUDACachingAllocator" in s
    return nvml or "out of memory" in s or "can't allocate memory" in s or "CUDA_ERROR_OUT_OF_MEMORY" in s


def _error_done(e, where):
    if _isinstance(e, _Done):
        return e
    if _is_oom(e):
        return _Done("runtime_error", (), f"out of memory {where}: {_exc_line(e)}")
    return _Done("runtime_error", (), f"exception {where}:\n{_exc_text(e)}")


class Channel:
    def __init__(self, endpoint):
        self.ctx = zmq.Context(1)
        self.sock = self.ctx.socket(zmq.PAIR)
        _z_set(self.sock, _LINGER, 0)        # never block on close with a dead peer
        _z_set(self.sock, _SNDTIMEO, 60000)  # nor on send
        _z_set(self.sock, _RCVTIMEO, 1000)   # receive in slices, checking the parent
        self.sock.connect(endpoint)
        self.parent = _os_getppid()

    def send(self, obj, frames=()):
        head = _json_dumps(obj).encode("utf-8")
        try:
            if frames:
                _z_send(self.sock, head, _SNDMORE)
                n = _len(frames)
                for i in _range(n):
                    _z_send(self.sock, frames[i], _SNDMORE if i + 1 < n else 0)
            else:
                _z_send(self.sock, head, 0)
        except _ZMQError:
            _os_exit(1)  # the evaluator is gone

    def recv(self):
        while True:
            try:
                first = _z_recv(self.sock, 0)
            except _ZAgain:
                if _os_getppid() != self.parent:
                    _os_exit(1)  # the evaluator died
                continue
            while _z_get(self.sock, _RCVMORE):
                _z_recv(self.sock, 0)  # the evaluator sends no frames; drop any
            return _json_loads(first.decode("utf-8"))

    def poll(self):
        """The next message if one has arrived, else None (never waits)."""
        try:
            first = _z_recv(self.sock, _NOBLOCK)
        except _ZAgain:
            if _os_getppid() != self.parent:
                _os_exit(1)  # the evaluator died
            return None
        while _z_get(self.sock, _RCVMORE):
            _z_recv(self.sock, 0)
        return _json_loads(first.decode("utf-8"))

    def done(self, status, checks=(), message="", laps=None):
        msg = {"type": "done", "status": status, "checks_failed": _list(checks), "message": message[-8000:]}
        if laps:
            msg["host_ms"] = {k: _round(v, 2) for k, v in laps.items()}
        self.send(msg)
        self.exit()

    def exit(self):
        """Gives the I/O thread a bounded time to flush the last message, then ends the process."""
        try:
            _z_set(self.sock, _LINGER, 2000)
            _z_close(self.sock)
            self.ctx.term()
        except _BaseException:
            pass
        _os_exit(0)


# ================================================================================================
# Tensors.

def _byte_view(t):
    """The tensor's contents as a flat uint8 tensor in native order, where the tensor lives."""
    return _T_view(_T_reshape(_T_contiguous(_T_detach(t)), (-1,)), _uint8)


def _raw_bytes(t):
    """Contiguous native-order bytes of a tensor (copied to the CPU)."""
    x = _byte_view(t)
    if x.device.type != "cpu":
        x = _T_cpu(x)
    return _nd_tobytes(_T_numpy(x))


def _kind_of(o):
    t = _type(o)
    if _isinstance(o, _Tensor):
        return f"tensor subclass {t.__name__}"
    if o is None:
        return "None"
    return t.__name__


def _output_items(out):
    """The list of outputs a forward returned: a plain tensor, or a tuple/list of them."""
    t = _type(out)
    if t is tuple or t is list or (_isinstance(out, tuple) and t.__module__ == "torch.return_types"):
        return [out[i] for i in _range(_len(out))]
    return [out]


def _tensors_in(inputs):
    """The plain tensors among `inputs` (nested lists and tuples too), in order."""
    found = []

    def add(t):
        if _type(t) is _Tensor:
            found.append(t)
        return t

    for x in inputs:
        _map_tensors(x, add)
    return found


def _input_storages(inputs):
    """Data pointers of the storages of the tensors among `inputs`."""
    ptrs = {_S_data_ptr(_T_untyped_storage(t)) for t in _tensors_in(inputs)}
    ptrs.discard(0)
    return ptrs


def _aliased_outputs(out, inputs):
    """For each output (see _output_items), whether it is a tensor that shares memory with one
    of the inputs: the input itself, a view of it, or the input changed in place."""
    ptrs = _input_storages(inputs)
    return [_type(o) is _Tensor and _S_data_ptr(_T_untyped_storage(o)) in ptrs for o in _output_items(out)]


def _output_sample(out):
    """Up to 4096 elements of each tensor output at evenly spaced positions, in float64 on the host
    (None for an output that is not a tensor): what _same_sample compares."""
    got = []
    for o in _output_items(out):
        if _type(o) is not _Tensor or _T_numel(o) == 0:
            got.append(None)
            continue
        flat = _T_reshape(o, (-1,))
        n = _T_numel(flat)
        k = _min(n, 4096)
        # Integer positions (a float linspace rounds past the end of tens of millions).
        idx = _torch_arange(k, dtype=_int64, device=flat.device) * (n - 1) // _max(k - 1, 1)
        got.append(_T_to(_T_to(_torch_index_select(flat, 0, idx), torch.float64), "cpu"))
    return got


def _same_sample(a, b, tolerances, slack):
    """Whether two _output_sample()s agree, floating elements within (atol + slack + rtol*|a|) of
    their dtype's tolerances (NaN where the other has NaN), others exactly. Returns (True, "") or
    (False, what differs)."""
    if _len(a) != _len(b):
        return False, f"{_len(a)} outputs, then {_len(b)}"
    for i, (x, y) in _enumerate(zip(a, b)):
        if x is None or y is None:
            continue
        if _T_size(x) != _T_size(y):
            return False, f"output {i}: another size"
        atol, rtol = tolerances
        s = slack[i] if i < _len(slack) else 0.0
        bad = (_torch_abs(x - y) > atol + s + rtol * _torch_abs(x)) | (_torch_isnan(x) != _torch_isnan(y))
        n = _int(_T_item(bad.sum()))
        if n:
            j = _int(_T_item(bad.nonzero()[0][0]))
            return False, (f"output {i}: {n} of {_T_numel(x)} sampled elements differ "
                           f"(first: {_float(x[j]):.6g}, then {_float(y[j]):.6g})")
    return True, ""


def _all_finite(out):
    """Whether no floating output holds NaN or an infinity (waits for the device)."""
    for o in _output_items(out):
        if _type(o) is _Tensor and _T_is_floating_point(o) and _T_numel(o) > 0 \
                and not _T_item(_T_all(_torch_isfinite(o))):
            return False
    return True


def _export(x):
    """CUDA IPC description of the uint8 device tensor x (kept alive by the caller): the handle of
    the allocation holding it, its offset there and its size. None if the driver refuses."""
    if _DRIVER_IPC is None:
        return None
    get_handle, get_range = _DRIVER_IPC
    ptr = _T_data_ptr(x)
    base, size = _c_uint64(0), _c_size_t(0)
    if get_range(_c_byref(base), _c_byref(size), ptr) != 0:
        return None
    handle = _string_buffer(64)
    if get_handle(handle, base.value) != 0:
        return None
    return {"ipc": _bytes_hex(handle.raw), "offset": ptr - base.value, "bytes": _int(_T_numel(x))}


def _encode(out, frames, device, exports=None):
    """Descriptions of a forward's outputs. Plain tensors travel as raw bytes in `frames`, or,
    when `exports` is a list, stay on the device: a fresh copy of each is appended to `exports`
    (the caller keeps it alive until the evaluator has read it) and described by its IPC handle."""
    descs = []
    for o in _output_items(out):
        if _type(o) is not _Tensor:
            descs.append({"kind": _kind_of(o)})
        elif o.device.type != device:
            descs.append({"kind": f"tensor on {o.device.type}, expected {device}"})
        elif o.layout != _strided:
            descs.append({"kind": f"tensor with layout {o.layout}"})
        elif o.dtype not in _SUPPORTED_DTYPES:
            descs.append({"kind": f"tensor of unsupported dtype {_str(o.dtype).replace('torch.', '')}"})
        else:
            desc = {"dtype": _SUPPORTED_DTYPES[o.dtype], "shape": [_int(d) for d in _T_size(o)]}
            shared = None
            if exports is not None:
                x = _T_clone(_byte_view(o))
                shared = _export(x)
                if shared is not None:
                    exports.append(x)
                    desc.update(shared)
                del x
            if shared is None:
                frames.append(_raw_bytes(o))
                desc["frame"] = _len(frames)
            descs.append(desc)
    return descs


def _map_tensors(x, fn):
    if _isinstance(x, _Tensor):
        return fn(x)
    if _type(x) in (list, tuple):
        return _type(x)(_map_tensors(v, fn) for v in x)
    return x


def _call_all(fn, inputs, inside, snapshot):
    """The calls of one timed sample, back to back: fn on each entry of `inputs` (a list of
    input lists). Returns (the outputs in order, [(i, snapshot(outputs of call i))] taken right
    after each call but the last returned, where `inside`, else []); the reference's sample and
    the candidate's run this same code, so both hold the same work."""
    outs = []
    snaps = []
    last = _len(inputs) - 1
    for i, x in _enumerate(inputs):
        outs.append(fn(*x))
        if inside and i < last:
            snaps.append((i, snapshot(outs[i])))
    return outs, snaps


def _output_storages(out):
    """For each output (see _output_items), where its data starts (a slice of a larger buffer
    starts where it starts); None for one that is not a plain tensor."""
    return [_T_data_ptr(o) if _type(o) is _Tensor else None for o in _output_items(out)]


def _checked_reference(ref_outs, storages, i):
    """The reference's outputs that call `i` of a timed sample is checked against, output by
    output: those of the last call of the sample whose same output used the same storage (a
    candidate may hand back one buffer call after call; the buffer then holds the last such
    call's values when the sample ends), else call i's own. `storages`: the candidate's
    _output_storages per call."""
    mine = storages[i]
    items = _output_items(ref_outs[i])
    got = []
    for m, ptr in _enumerate(mine):
        j = i
        if ptr is not None and ptr != 0:
            for later in _range(_len(storages) - 1, i, -1):
                if m < _len(storages[later]) and storages[later][m] == ptr:
                    j = later
                    break
        src = _output_items(ref_outs[j]) if j != i else items
        got.append(src[m] if m < _len(src) else None)
    if _len(items) > _len(mine):
        got.extend(items[_len(mine):])  # a different number of outputs: check_round_outputs says so
    return got


def _output_bytes(out):
    """The bytes a call must have written to produce `out`: for each storage its tensor outputs
    use, the largest span of memory one of them covers there (a broadcast or strided view
    covers less than its numel; two views of one buffer count once)."""
    spans = {}
    for o in _output_items(out):
        if _type(o) is not _Tensor or _T_numel(o) == 0:
            continue
        span = 1 + _sum((n - 1) * _abs(st) for n, st in zip(_T_size(o), _T_stride(o)))
        nbytes = _min(_int(_T_numel(o)), span) * o.element_size()
        key = _S_data_ptr(_T_untyped_storage(o))
        spans[key] = _max(spans.get(key, 0), nbytes)
    return _sum(spans.values())


class _Taken:
    """A snapshot of one tensor output of a timed call (Worker.snapshot): its values at the
    positions `where` (a seed of the harness kernels' positions, an index tensor, or None for
    all, in order), its size and dtype."""
    __slots__ = ("values", "where", "size", "dtype")

    def __init__(self, values, where, size, dtype):
        self.values = values
        self.where = where
        self.size = size
        self.dtype = dtype


def _clone_inputs(inputs):
    return [_map_tensors(x, lambda t: _T_clone(t)) for x in inputs]


def _same_bytes(a, b):
    """Bytewise equality of two tensors of the same dtype, shape and device (NaN equals NaN),
    computed where they live."""
    if _KERNELS is not None and a.device.type == "cuda":
        return not _KERNELS.bytes_differ(_byte_view(a), _byte_view(b))
    return _bool(_torch_equal(_byte_view(a), _byte_view(b)))


def _input_layout(inputs):
    """Where each input tensor lies: (data pointer, storage offset, size, stride) in order. A
    clone starts at offset 0, so the trials compare this before and after a call besides
    _same_input's bytes (their inputs lie at offsets into larger allocations, as timed ones do)."""
    return [(_T_data_ptr(t), _T_storage_offset(t), _tuple(_T_size(t)), _T_stride(t)) for t in _tensors_in(inputs)]


def _inputs_unchanged(inputs, layout, pristine):
    """Whether a call left `inputs` where they lay (_input_layout before it) and as they were
    (their pristine clones)."""
    return _input_layout(inputs) == layout and all(_same_input(a, b) for a, b in zip(inputs, pristine))


def _same_input(a, b):
    """True when input `a` (after the call) equals its pristine clone `b`, bytewise (its place in
    memory is _input_layout's)."""
    if _isinstance(b, _Tensor):
        if _type(a) is not _type(b):
            return False
        if a.dtype != b.dtype or a.device != b.device or _tuple(_T_size(a)) != _tuple(_T_size(b)) \
                or _T_stride(a) != _T_stride(b):
            return False
        return _same_bytes(a, b)
    if _type(b) in (list, tuple):
        return _type(a) is _type(b) and _len(a) == _len(b) and all(_same_input(x, y) for x, y in zip(a, b))
    try:
        return _bool(a == b)
    except Exception:
        return _repr(a) == _repr(b)


def _os_threads():
    try:
        return _len(_os_listdir("/proc/self/task"))
    except _OSError:
        return -1


def _tids():
    """The ids of this process's OS threads, or None where /proc cannot say."""
    try:
        return {_int(n) for n in _os_listdir("/proc/self/task")}
    except (_OSError, ValueError):
        return None


def _thread_cpu_ns(tid):
    """CPU time of thread `tid` of this process in nanoseconds (its per-thread CPU clock, as
    pthread_getcpuclockid gives: ((~tid) << 3) | CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED), or None
    once the thread has ended. A thread blocked in a wait gains none."""
    try:
        return _clock_gettime_ns(((~tid) << 3) | 6)
    except _OSError:
        return None


def _py_threads():
    return _active_count(), _len(_current_frames())


def _thread_names():
    try:
        return ", ".join(sorted(t.name for t in _enumerate_threads() if t is not threading.main_thread()))
    except Exception:
        return "?"


# ================================================================================================
# The worker.

class Worker:
    def __init__(self, args):
        self.device = args.device
        self.cuda = args.device == "cuda"
        self.scratch = args.scratch
        self.chan = Channel(args.endpoint)
        # Triton's builds go to the evaluator's build service from here on (set before the
        # worker's snapshots, so that they are part of what the runtime checks compare against).
        global _TRITON_SERVICE, _TRITON_SCRATCH
        _TRITON_SERVICE = self.request_build
        _TRITON_SCRATCH = self.scratch
        self.core = None
        self.full = None
        self.flags0 = None
        self.kernel_mode = None   # how "kernels" is counted; None: not reliable here
        self.warmed = False
        self.prime_inputs = None
        self.round_no = 0
        self.dists = [0, 1]       # input distributions of the rounds (reference_phase)
        self.trial_dists = []     # each trial's input distribution (reference_phase)
        self.ref_aliased = []     # which of the reference's outputs share memory with an input
        self.ref_param_storages = set()
        self.ref_fn = None
        self.graph = None
        self.mark_step = None
        self.exports = None  # a list while outputs stay on the device (job "outputs": "device")
        # Host milliseconds per step (reference, load, trials, timing rounds, finish), sent in
        # the `done` message for `crucible eval --verbose`: where a verdict's wall time goes.
        self.laps = {}
        # Python's cyclic garbage collections, by generation, and their milliseconds (laps
        # "gc: ..."; see quiet_gc in run()).
        self.gc_t0 = 0
        self.timing_now = False  # inside timing(): collections then are also counted apart
        gc.callbacks.append(self.gc_lap)
        self.floor_bytes = None  # the fewest bytes a checked timed call of the candidate wrote (_output_bytes)
        self.floor_ms = None  # the physics floor of a timed call (measure_floor)
        self.round_fracs = []  # (round, elements compared, count matching or mismatch slot): check_round_outputs
        self.can_spin = False  # set per job: the harness's spin kernel or torch's _cuda_sleep exists
        self.pair_first = None  # order of the first round of the current pair (one_round)
        self.early_snapshots = None  # (core, full), made while waiting for the job (CUDA)
        self.isolation = None  # the sandbox's layers (confine.py), for the `started` message
        # Threads started by the candidate's first calls (see foreign_mark): the OS threads
        # before them; the CPU time of every thread not among those at the last mark; the
        # timing rounds in which such threads ran outside the candidate's calls, and for how long.
        self.ref_profile = None  # the reference's profiled call's counts and names (own_work)
        self.cand_flags = {}  # settings the candidate chose for its own calls (_CANDIDATE_FLAG_SETTERS)
        self.thread_base = None
        self.foreign = None
        self.foreign_rounds = set()
        self.foreign_ns = 0

    def lap(self, name, t0):
        """Adds the time since t0 (perf_counter_ns) to step `name`; returns now."""
        now = _perf_counter_ns()
        self.laps[name] = self.laps.get(name, 0.0) + (now - t0) / 1e6
        return now

    def gc_lap(self, phase, info):
        """gc.callbacks: counts each collection and its time."""
        if phase == "start":
            self.gc_t0 = _perf_counter_ns()
            return
        key = f"gc: generation {info['generation']} collections"
        self.laps[key] = self.laps.get(key, 0) + 1
        if self.timing_now:
            self.laps["gc: collections while timing"] = self.laps.get("gc: collections while timing", 0) + 1
        self.lap("gc: collections", self.gc_t0)

    # -- start-up --------------------------------------------------------------------------
    def start(self):
        threads = os.environ.get("CRUCIBLE_CPU_THREADS")
        if threads and threads.isdigit() and _int(threads) > 0:
            torch.set_num_threads(_int(threads))
        _set_grad_enabled(False)  # inference only, for the reference and the candidate alike
        # Fixed backend settings (checked after every candidate call).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.benchmark = False
        _prewarm(self.cuda)
        # Device initialisation goes in three steps, each at the evaluator's word (the driver,
        # the context, the profiler's first use): it holds the device during those that must
        # not run beside another candidate's timed rounds (evaluator.init_hold).
        self.chan.send({"type": "started", "pid": _os_getpid(), "isolation": self.isolation})
        self.await_step("init")
        t_init = _perf_counter_ns()
        # torch asks NVML for the device count first; NVML cannot start inside the sandbox,
        # torch falls back to the CUDA runtime, and the warning it prints is noise.
        warnings.filterwarnings("ignore", message="Can't initialize NVML")
        if self.cuda:
            global _DRIVER_IPC
            _DRIVER_IPC = _load_driver_ipc()
            torch.cuda.init()  # cuInit; the context is created on the first allocation
        t_cuinit = _perf_counter_ns()
        self.chan.send({"type": "driver"})
        self.await_step("context")
        t_context0 = _perf_counter_ns()
        if self.cuda:
            self.stream0 = torch.cuda.current_stream()
            self.ev0 = torch.cuda.Event(enable_timing=True)
            self.ev_call = torch.cuda.Event(enable_timing=True)
            self.ev1 = torch.cuda.Event(enable_timing=True)
            _torch_empty(1, device="cuda")
            _cuda_synchronize()
            hardware = torch.cuda.get_device_name(0)
            kernels = self.load_kernels()
        else:
            hardware = "cpu: " + _cpu_model()
            kernels = "none (CPU)"
        t_context = _perf_counter_ns()
        self.chan.send({"type": "context"})
        # The profiler's first use in a process (CUPTI on CUDA) takes about a second: pay it
        # here, in the warm pool, not in a job's trials. Without a GPU that first use also logs
        # "gpuGetDeviceCount failed" (libkineto) to the process's stderr, which is the user's
        # terminal: on the CPU it runs with fd 2 on /dev/null (no candidate code has run yet).
        quiet = saved = None
        try:
            if not self.cuda:
                quiet = os.open(os.devnull, os.O_WRONLY)
                saved = os.dup(2)
                os.dup2(quiet, 2)
            self.profiled(lambda: _T_fill_(_torch_empty(1, device=self.device), 1))
        except _Exception:
            pass
        finally:
            if saved is not None:
                os.dup2(saved, 2)
                os.close(saved)
            if quiet is not None:
                os.close(quiet)
        t_profiler = _perf_counter_ns()
        self.chan.send({"type": "ready", "pid": _os_getpid(), "python": platform.python_version(),
                        "torch": torch.__version__.split("+")[0], "device": self.device,
                        "hardware": hardware, "kernels": kernels,
                        "init_ms": {"driver": (t_cuinit - t_init) / 1e6, "context": (t_context - t_context0) / 1e6,
                                    "profiler": (t_profiler - t_context) / 1e6}})

    def load_kernels(self):
        """Loads the harness's own kernels (_HarnessKernels); says which operations the worker uses."""
        global _KERNELS
        if _KERNELS_IMAGE is None:
            return "torch operations: " + (_KERNELS_ERROR or "no harness kernels given (--kernels)")
        try:
            _KERNELS = _HarnessKernels(_KERNELS_IMAGE)
            _cuda_synchronize()
        except _Exception as e:
            _KERNELS = None
            return "torch operations: " + _str(e)
        return "module"

    def spin(self, cycles):
        """CUDA: keeps the device busy for `cycles` SM clock cycles (one thread)."""
        if _KERNELS is not None:
            _KERNELS.spin(cycles)
        else:
            _cuda_sleep(cycles)

    def await_step(self, step):
        """Waits for the evaluator's {"type": step}: its word to go on initialising. A worker
        asked to `build` instead is a builder (the evaluator's build service): it builds, sends
        the library and exits, never touching the device."""
        msg = self.chan.recv()
        if step == "init" and msg.get("type") == "build":
            global _TRITON_SERVICE
            _TRITON_SERVICE = None  # a builder builds here
            try:
                if msg.get("fn") in ("triton_cc", "triton_kernel"):
                    lib = build_triton(msg, self.scratch)
                else:
                    lib = build_extension(msg, self.scratch)
            except _BaseException as e:  # the build's own failure: its log goes back
                self.chan.send({"type": "build_failed", "log": _tail(_str(e), 60)})
            else:
                self.chan.send({"type": "built"}, [lib])
            self.chan.exit()
        if msg.get("type") != step:
            raise _Done("runtime_error", (), f"expected {step}, got {msg.get('type')!r}")

    def request_build(self, req):
        """The evaluator's build service (_keyed_build, Triton's hooks): one request, one reply."""
        self.chan.send(req)
        reply = self.chan.recv()
        if reply.get("type") == "stop":
            _os_exit(0)
        return reply

    # -- helpers -----------------------------------------------------------------------------
    def sync(self):
        if self.cuda:
            _cuda_synchronize()

    def flags(self):
        vals = {}
        for name, g in _FLAG_GETTERS:
            try:
                v = g()
            except Exception as e:  # noqa: BLE001
                v = "error: " + _type(e).__name__
            if name.startswith("sys."):
                v = v is None
            vals[name] = v
        for name, d in _GLOBAL_HOOK_DICTS:
            vals["nn.Module hooks " + name] = (_MODULE_MODULE.__dict__.get(name) is d, _len(d))
        if self.cuda:
            try:
                vals["current_stream"] = torch._C._cuda_getCurrentStream(0)
            except Exception:
                pass
        return vals

    def check_state(self, where):
        """runtime:patched and runtime:backend_flags, after candidate code ran."""
        changed = _list(self.core.changed())
        # The worker's own methods replaced on its instance (reached through frames: refused
        # statically, and looked for here as well).
        changed += ["Worker." + k for k in _list(self.__dict__) if k in _WORKER_METHODS]
        if changed:
            raise _Done("rejected", ["runtime:patched"],
                        f"{where}: the candidate patched {', '.join(changed)}")
        now = self.flags()
        # The candidate's own settings (applied again before each of its calls, in
        # candidate_flags) are kept, and the harness's put back for everything else. Some are
        # derived from others (allow_tf32 from fp32_precision), so all are put back, in order.
        ours = False
        for name, _ in _CANDIDATE_FLAG_SETTERS:
            if name in self.cand_flags or now.get(name) != self.flags0.get(name):
                self.cand_flags[name] = now.get(name)
                ours = True
        if ours:
            self.apply_flags(self.flags0)
            now = self.flags()
        diff = [f"{k}: {self.flags0[k]!r} -> {now.get(k)!r}" for k in self.flags0 if now.get(k) != self.flags0[k]]
        if diff:
            raise _Done("rejected", ["runtime:backend_flags"],
                        f"{where}: the candidate changed process-wide settings: {'; '.join(diff)}")

    def candidate_flags(self):
        """Puts the settings the candidate chose for itself (check_state) in force for its
        next call."""
        if self.cand_flags:
            self.apply_flags(self.cand_flags)

    @staticmethod
    def apply_flags(vals):
        """Sets the settings of _CANDIDATE_FLAG_SETTERS to `vals` (those it holds), in order. A
        legacy switch whose getter failed (the candidate used fp32_precision) is left to the
        fp32_precision settings that follow it."""
        for name, setter in _CANDIDATE_FLAG_SETTERS:
            v = vals.get(name)
            if v is None or (_isinstance(v, _str) and v.startswith("error: ")):
                continue
            try:
                setter(v)
            except Exception:  # noqa: BLE001
                pass  # what it leaves different from the harness's is refused by check_state

    def check_full(self, where):
        changed = self.full.changed()
        if changed:
            raise _Done("rejected", ["runtime:patched"],
                        f"{where}: the candidate patched {', '.join(changed)}")

    def make_inputs(self, seed, dist):
        """get_inputs() under `seed`. Distribution 1 scales every floating input elementwise by
        U(0.5, 2) (signs and domains kept); distribution 2 by U(0.5, 2) with a random sign, which
        a task whose get_inputs() keeps a sign never makes; distribution 3 as 2, times 32
        (magnitudes the task never makes, where a shortcut that holds only near its own scale
        fails: a softmax without its max subtraction overflows; docs/evaluator.md, Correctness).
        Contiguous CUDA tensors go through _HarnessKernels.scale_uniform, others through torch
        operations. Factory calls without a device create their tensors on the worker's device
        directly: generating tens of millions of values on the host and copying them over took
        most of a GPU evaluation's time."""
        _torch_manual_seed(seed)
        with _torch_device(self.device):
            raw = self.task.get_inputs()
        out = []
        gen = None
        for i, x in _enumerate(raw):
            if _isinstance(x, _Tensor):
                x = _T_to(x, self.device)
                if dist == 0 or not _T_is_floating_point(x):
                    pass
                elif _KERNELS is not None and x.device.type == "cuda" and x.dtype in _HarnessKernels._FLOAT \
                        and _T_is_contiguous(x):
                    x = _KERNELS.scale_uniform(x, (seed * 7919 + 17 + 1_000_003 * i) % (1 << 64), signed=dist >= 2)
                else:
                    if gen is None:
                        gen = _Generator(device=self.device).manual_seed((seed * 7919 + 17) % (1 << 63))
                    size = _tuple(_T_size(x))
                    f = _T_uniform_(_torch_empty(size, dtype=x.dtype, device=self.device), 0.5, 2.0, generator=gen)
                    if dist >= 2:
                        sign = _T_uniform_(_torch_empty(size, dtype=x.dtype, device=self.device), 0.0, 1.0,
                                           generator=gen)
                        f = _T_mul(f, _torch_where(_T_lt(sign, 0.5), -1.0, 1.0))
                    x = _T_mul(x, f)
                if dist == 3 and _T_is_floating_point(x):
                    x = _T_mul(x, _DIST3_FACTOR)
            out.append(x)
        return out

    def poison_tensor(self, t):
        """Overwrite a reference output's whole storage with 0xFF bytes (NaN for floats)."""
        if _type(t) is not _Tensor:
            return
        st = _T_untyped_storage(t)
        if _S_data_ptr(st) in self.ref_param_storages:
            return  # a view of a parameter or buffer: the reference still needs it
        u8 = _torch_empty(0, dtype=_uint8, device=t.device)
        _T_set_(u8, st)
        _T_fill_(u8, 255)

    def poison_free_pool(self):
        """CUDA: fill the caching allocator's free (reserved but unallocated) blocks with 0xFF,
        so that a candidate's torch.empty cannot return the reference's old values."""
        if not self.cuda:
            return
        _cuda_synchronize()
        held = []
        small_max = 1 << 20  # requests up to 1 MiB are served from the small pool
        try:
            for _ in _range(6):
                segments = torch.cuda.memory_snapshot()
                progress = False
                for seg in segments:
                    if seg.get("device", 0) != 0:
                        continue
                    small = seg.get("segment_type") == "small"
                    for b in seg.get("blocks", []):
                        if b.get("state") != "inactive":
                            continue
                        size = _int(b.get("size", 0))
                        pieces = []
                        if small:
                            while size > 0:
                                p = _min(size, small_max)
                                pieces.append(p)
                                size -= p
                        elif size > small_max:
                            pieces.append(size)
                        for p in pieces:
                            try:
                                held.append(_torch_empty(p, dtype=_uint8, device="cuda"))
                                progress = True
                            except _BaseException:
                                break
                if not progress:
                    break
            for t in held:
                _T_fill_(t, 255)
            _cuda_synchronize()
        except _Done:
            raise
        except _BaseException:
            pass  # best effort; the poisoned reference outputs remain the main defence
        finally:
            del held
            _cuda_synchronize()

    def flush(self, k, cover=True):
        """Evict caches by reading flush_bytes of a scratch buffer (L2 on CUDA, LLC on CPU).
        Reading leaves clean lines behind: after a write-based flush the timed call paid for
        writing the flush's dirty lines back, a fixed cost that pulled every speedup toward 1.
        CUDA: nothing waits for it; with `cover` a spin follows on the stream (see
        _LAUNCH_COVER_CYCLES), and the caller records the start event and makes the call while
        the device works through both (a timed sample closes the gate instead: begin_sample)."""
        if _KERNELS is not None and self.cuda:
            _KERNELS.flush(self.flush_buf)
        else:
            _torch_sum(self.flush_buf, 0, dtype=_int64, out=self.flush_sum)
        if cover and self.cuda and self.can_spin:
            self.spin(_LAUNCH_COVER_CYCLES)

    def begin_sample(self, k):
        """CUDA, before a timed sample's start event: the cache flush, then the gate
        (_HarnessKernels.gate_close) where the harness kernels are loaded, else the spin that
        covers the first call's launch (flush). Returns whether the gate is closed: the caller
        queues the start event and the sample's calls, records its stop, and calls
        end_sample(gated) (in a finally), before it waits for the device.

        Behind the gate the device runs nothing until the host has queued the whole sample, so
        the calls run back to back as fast as the device runs them, and no call waits for the
        host to launch it: without it, a sample of 60 calls of a 15 us kernel was timed at the
        host's pace (25 us a call on an H100 host busy with other workers' builds, and that pace
        moved with the host's load). What is timed is the device's time for the calls' work; a
        forward that waits for the device (a synchronisation, .item()) holds the gate until
        _GATE_CYCLES run out and is then timed at the host's pace from there on. The gate fills
        every SM, so no stream of the candidate's runs ahead of the start event either."""
        self.flush(k, cover=_KERNELS is None)
        if _KERNELS is None:
            return False
        _KERNELS.gate_close(_GATE_CYCLES)
        return True

    def gated_calls(self, fn, inputs, inside, k):
        """CUDA: a timed sample's calls (_call_all) between the start event and the stream's stop
        event, behind the gate (begin_sample), which is opened however they end. The reference's
        sample and the candidate's run this same code. Returns (outputs, in-sample snapshots,
        whether the gate was closed); the caller waits for the device and reads the times."""
        gated = self.begin_sample(k)
        _Ev_record(self.ev0, self.stream0)
        try:
            t_host = _perf_counter_ns()
            outs, inner = _call_all(fn, inputs, inside, self.snapshot_inside)
            _Ev_record(self.ev_call, self.stream0)
            self.host_ms = (_perf_counter_ns() - t_host) / 1e6 / _len(inputs)
        finally:
            self.end_sample(gated)
        return outs, inner, gated

    def finish_sample(self, gated, n):
        """CUDA, after gated_calls: waits for the whole device (work on side streams counts),
        records the stop event after it, counts a gate timeout, and returns the (synced, stream)
        milliseconds per call of the `n` calls (elapsed)."""
        _cuda_synchronize()
        _Ev_record(self.ev1, self.stream0)
        _Ev_synchronize(self.ev1)
        self.gate_outcome(gated)
        return self.elapsed(n)

    def end_sample(self, gated):
        if gated:
            _KERNELS.gate_open()

    def gate_outcome(self, gated):
        """After the device was waited for: counts a gate that stopped waiting before the host
        opened it (`timing: gate timeouts` in --verbose's laps)."""
        if gated and _KERNELS.gate_timed_out():
            self.laps["timing: gate timeouts"] = self.laps.get("timing: gate timeouts", 0) + 1

    # -- kernel counting ---------------------------------------------------------------------
    def profiled(self, fn):
        """Runs fn() once under torch.profiler (and, for extension calls, sys.setprofile).
        Returns (result, counts) with counts = dict(device, launches, ops, ext)."""
        acts = [_ProfilerActivity.CPU]
        if self.cuda:
            acts.append(_ProfilerActivity.CUDA)
        modules = _sys_modules
        ext_calls = [0]

        def hook(frame, event, arg):
            # A call into a compiled extension outside every imported package: load_inline's
            # modules and inductor's CPU kernels ("<hash>.kernel") have no top-level package in
            # sys.modules, unlike torch's, numpy's or the builtins' functions.
            if event == "c_call":
                m = _getattr(arg, "__module__", None)
                if _isinstance(m, str) and m.partition(".")[0] not in modules:
                    ext_calls[0] += 1

        window_ms = None
        self.sync()  # nothing of the harness's still runs when the profiler starts
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the profiler warns about its event cycles
            with _profile(activities=acts) as prof:
                if self.cuda:
                    _Ev_record(self.ev0, self.stream0)
                _setprofile(hook)
                try:
                    out = fn()
                finally:
                    _setprofile(None)
                self.sync()
                if self.cuda:
                    _Ev_record(self.ev1, self.stream0)
                    _Ev_synchronize(self.ev1)
                    window_ms = _Ev_elapsed(self.ev0, self.ev1)
                    # The profiler stays on a moment longer: work that a thread of the candidate
                    # queues after the synchronisation lands in its record, not in the window.
                    t_late = _perf_counter_ns()
                    while _perf_counter_ns() - t_late < _LATE_WORK_NS:
                        pass
                    self.sync()
        dev = launches = ops = 0
        spans = []
        kernels, operators = {}, {}  # name -> count
        for e in prof.events():
            name = e.name or ""
            if e.device_type == _DeviceType.CUDA:
                dev += 1
                spans.append((e.time_range.start, e.time_range.end))
                kernels[name] = kernels.get(name, 0) + 1
            elif "LaunchKernel" in name or "GraphLaunch" in name or "cuLaunch" in name:
                launches += 1
            elif "::" in name:
                ops += 1
                operators[name] = operators.get(name, 0) + 1
        # The device's busy time over all streams (the union of its activities' intervals, us).
        busy_us = 0.0
        end = None
        for a, b in _sorted(spans):
            if end is None or a > end:
                busy_us += b - a
                end = b
            elif b > end:
                busy_us += b - end
                end = b
        return out, {"device": dev, "launches": launches, "ops": ops, "ext": ext_calls[0],
                     "busy_ms": busy_us / 1e3, "window_ms": window_ms, "kernels": kernels, "operators": operators}

    def check_device_time(self, counts, where):
        """The cross-check of the clock (CUDA Agent's): the profiler's device time over all
        streams for a call (profiled) against the clock's window for it, from the start event to
        the event after a device-wide synchronisation. Work the call started that the window
        does not hold (queued after the synchronisation, by a thread of the candidate) is a
        finding: runtime:unseen_work."""
        window = counts.get("window_ms")
        if window is None:
            return
        busy = counts["busy_ms"]
        if busy > window * 1.05 + 0.05:
            raise _Done("rejected", ["runtime:unseen_work"],
                        f"{where}: the profiler saw {busy * 1e3:.1f} us of device work from the candidate's "
                        f"call on all streams, the clock's window for it holds {window * 1e3:.1f} us; "
                        "work that runs after the call's clock stopped is not counted, so it is refused")

    def own_work(self, counts):
        """How far what the candidate's profiled call ran is from what the reference's profiled
        call ran: the launches by which their kernels differ, counted by name (device kernels
        where the device's activities are counted; else operators, views, metadata and
        allocations left out), plus the candidate's calls into compiled extensions. 0: it ran
        the reference's own kernels, each as many times (a fallback, or the reference itself:
        Dr. Kernel's lazy optimisation), which earns no speed credit (the evaluator caps its
        speedup at 1). The same kernels in other numbers (a chain of products reassociated, a
        normalisation folded away) differ. None where the reference's profile is not known."""
        ref = self.ref_profile
        if ref is None:
            return None
        key = "kernels" if self.kernel_mode == "device" and counts["device"] > 0 else "operators"
        a, b = counts[key], ref[key]
        drop = _NO_KERNEL_OPS if key == "operators" else ()
        names = (_set(a) | _set(b)) - _set(drop)
        return _sum(_abs(a.get(n, 0) - b.get(n, 0)) for n in names) + counts["ext"]

    def kernel_count(self, counts):
        if self.kernel_mode == "device":
            return counts["device"] + (counts["launches"] if counts["device"] == 0 else 0)
        if self.kernel_mode == "launches":
            return counts["launches"]
        return counts["ops"] + counts["ext"]

    # -- the job -----------------------------------------------------------------------------
    def run(self):
        if self.cuda:
            # Ready, waiting for a job: make the snapshots now (~0.1 s on an H100's host), and
            # only bring them up to date when the candidate loads. (Not on the CPU, where this
            # would compete with a neighbour's timed rounds for the cores.)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.early_snapshots = (_core_snapshot(globals()), _full_snapshot())
        job = self.chan.recv()
        if job.get("type") != "job":
            raise _Done("runtime_error", (), f"expected a job message, got {job.get('type')!r}")
        self.job = job
        self.t_job = _perf_counter_ns()
        self.seed = _int(job["seed"])
        # The correctness tolerances (evaluator.fp32_atol ...), which every timed call's outputs
        # are held to as well (check_round_outputs).
        tol = {"float64": (1e-4, 1e-4), "float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (1e-2, 1e-2)}
        tol.update(job.get("tolerances") or {})
        self.tolerances = {_getattr(torch, name): (_float(a), _float(r)) for name, (a, r) in tol.items()}
        self.trials = _int(job.get("trials", 5))
        # Outputs may differ from the reference by this many times its own rounding error on the
        # same inputs (rounding_error), beyond atol and rtol; 0: fixed tolerances only.
        self.rounding_factor = _max(_float(job.get("rounding_factor", 0) or 0), 0.0)
        # Per input distribution, per output: rounding_factor times the output's largest rounding
        # error in that distribution's trials; the current round's (tolerance).
        self.round_slack = {}
        self.cur_slack = []
        self.baseline = job.get("baseline", "eager")
        flush_bytes = _int(job.get("flush_bytes") or ((256 << 20) if self.cuda else (64 << 20)))
        self.rng_random = _Random(_fresh_seed()).random
        # Each timing round's inputs start at a random offset into their own allocation, so a
        # verdict's rounds see many placements instead of the few blocks the caching allocator
        # would hand back round after round (docs/evaluator.md, Timing: placement).
        self.jitter_bytes = _max(_int(job.get("placement_jitter_bytes", 0)), 0)
        self.timing_reserve = job.get("timing_reserve") is True
        # evaluator.sample_ms / max_calls: a timed sample is `calls` calls back to back, each on
        # its own fresh inputs, as many as make the sample last sample_ms (choose_calls); 0 or
        # a cuda-graph baseline: one call per sample.
        self.sample_ms = _max(_float(job.get("sample_ms", 0) or 0), 0.0)
        self.max_calls = _max(_int(job.get("max_calls", 1) or 1), 1)
        self.calls = 1
        self.host_ms = 0.0  # the host's time per call of the last timed sample (choose_calls)
        # evaluator.quiet_gc: everything alive now (torch, the harness, its snapshots: some
        # 260,000 objects) leaves the cyclic collector's reach, so a collection scans only what
        # the job allocates; and timing() turns the collector off (as timeit does), so no
        # collection runs inside a timed call. A full collection over those objects took
        # 162-170 ms on an H100's host (tools/bench/gc_probe.py).
        self.quiet_gc = job.get("quiet_gc") is True
        # evaluator.eval_mode: both models in eval mode once constructed (BatchNorm's running
        # statistics, Dropout off), as CUDA-L1's harness runs them; else training mode.
        self.eval_mode = job.get("eval_mode") is True
        if self.quiet_gc:
            _gc_freeze()
        self.placements = set()
        # Positions compared in timing rounds; made here, before any candidate code exists.
        self.sample_gen = _Generator(device=self.device).manual_seed(_fresh_seed())
        self.sample_bits = _Random(_fresh_seed()).getrandbits
        self.can_spin = _KERNELS is not None or _cuda_sleep is not None
        if _KERNELS is not None and self.cuda:
            # Mismatch counters of the timing rounds' output checks (check_round_outputs).
            self.round_bad = _torch_empty(_ROUND_SLOTS, dtype=_int64, device=self.device)
            self.round_used = 0
            _KERNELS._zero(_T_data_ptr(self.round_bad), _ROUND_SLOTS * 8)
        if self.baseline not in ("eager", "compile", "compile-reduce-overhead", "cuda-graph"):
            raise _Done("runtime_error", (), f"unknown baseline {self.baseline!r}")
        if self.baseline == "cuda-graph" and not self.cuda:
            raise _Done("runtime_error", (), "the cuda-graph baseline needs a CUDA device; this worker runs on the CPU")

        # 3. Static checks, before any candidate code runs.
        src = job["candidate_source"]
        task_src = job["task_source"]
        # A check of the task alone (device_evaluator::check_task): its reference is built and
        # run on the first trial's inputs, and nothing of a candidate's is looked at.
        self.reference_only = job.get("reference_only") is True
        self.static = _bool(job.get("static_checks", True)) and not self.reference_only
        # Outputs stay on the device when the evaluator asks (each one the driver cannot export
        # still travels as bytes).
        self.exports = [] if (self.cuda and job.get("outputs") == "device") else None
        if self.static:
            problems = _STATIC_CHECKS_MODULE.check_source(src, task_src)
            if problems:
                names = []
                for cls, _, _ in problems:
                    if cls not in names:
                        names.append(cls)
                msg = "; ".join(f"line {line}: {m}" for _, line, m in problems[:20])
                raise _Done("rejected", names, msg)

        self.redirect_output()
        self.flush_buf = _torch_empty(_max(flush_bytes // 4, 1), dtype=_int32, device=self.device)
        _T_fill_(self.flush_buf, 1)
        self.flush_sum = _torch_empty((), dtype=_int64, device=self.device)

        # 4. Reference outputs, before the candidate is imported.
        self.reference_phase(task_src)
        if self.reference_only:
            raise _Done("ok", (), f"the task's reference ran on {self.trials} trial input(s) and gave the same "
                                  "outputs when called again")

        # 5. Load the candidate without the device.
        self.chan.send({"type": "phase", "name": "load"})
        self.load_phase(src)
        self.chan.send({"type": "loaded"})
        msg = self.chan.recv()
        if msg.get("type") == "stop":
            _os_exit(0)
        if msg.get("type") != "run":
            raise _Done("runtime_error", (), f"expected run, got {msg.get('type')!r}")
        if self.exports:
            self.exports = []  # the reference's exports: the evaluator has closed its mappings

        # 7. Trials.
        t0 = _perf_counter_ns()
        self.construct_model()
        t0 = self.lap("trials: ModelNew", t0)
        self.poison_free_pool()
        t0 = self.lap("trials: poison free pool", t0)
        self.trial_phase()
        self.lap("trials: calls and outputs", t0)

        # 8-10. Timing on request.
        while True:
            msg = self.chan.recv()
            if self.exports:
                self.exports = []  # the evaluator has compared the trials' outputs
            kind = msg.get("type")
            if kind == "stop":
                _os_exit(0)
            if kind == "time":
                rounds = _int(msg.get("rounds", 30))
                msg = self.timing(rounds, _float(msg.get("warmup_ms", 300)), _int(msg.get("warmup_rounds", 3)),
                                  msg.get("announce") is True)
                msg["type"] = "timing"
                self.chan.send(msg)
                continue
            if kind == "finish":
                t0 = _perf_counter_ns()
                self.check_full("at the end")
                self.check_state("at the end")
                self.lap("finish: snapshot checks", t0)
                raise _Done("ok", (), "", self.laps)
            raise _Done("runtime_error", (), f"unexpected message {kind!r}")

    def redirect_output(self):
        """The candidate's prints and build logs go to a file in the scratch directory."""
        if os.environ.get("CRUCIBLE_WORKER_KEEP_STDIO"):
            return
        try:
            fd = os.open(os.path.join(self.scratch, "worker.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        except OSError:
            pass

    def exec_module(self, name, src, filename):
        path = os.path.join(self.scratch, filename)
        with open(path, "w", encoding="utf-8") as f:
            f.write(src)
        mod = _ModuleType(name)
        mod.__file__ = path
        code = compile(src, path, "exec")
        sys.modules[name] = mod  # some libraries (dataclasses, triton, dynamo) look modules up
        exec(code, mod.__dict__)
        return mod

    def reference_phase(self, task_src):
        stage = "in the task's reference"
        try:
            self.task = self.exec_module("crucible_task", task_src, "task.py")
            for n in ("Model", "get_inputs", "get_init_inputs"):
                if not _hasattr(self.task, n):
                    raise _Done("runtime_error", (), f"the task defines no {n}")
            # torch's intra-op thread pool, started here if the reference does not start it,
            # so that its threads are the harness's (Worker.foreign_mark), not the candidate's.
            torch.ones(1 << 18).sum()
            _torch_manual_seed(self.seed)
            init = _list(self.task.get_init_inputs())
            self.init_inputs = init
            ref = self.task.Model(*init)
            ref = ref.to(self.device)
            if self.eval_mode:
                ref.eval()
            self.ref = ref
            ref64 = self.reference_float64(ref)
            self.ref_param_storages = {
                _S_data_ptr(_T_untyped_storage(p)) for p in _list(ref.parameters()) + _list(ref.buffers())}
            pending = []  # sent once the device is free (see device_done())
            t0 = self.lap("reference: task and Model", self.t_job)
            # The input distributions (make_inputs): 2 as well, unless the task says that its
            # inputs keep the domain get_inputs() gives them (INPUT_DOMAIN = "as-given"), or the
            # reference's outputs are not finite there while they are on the task's own inputs.
            domain = _getattr(self.task, "INPUT_DOMAIN", "any")
            if domain not in ("any", "as-given"):
                raise _Done("runtime_error", (),
                            f"the task's INPUT_DOMAIN is {domain!r}; it must be 'any' or 'as-given'")
            self.dists = [0, 1, 2, 3] if domain == "any" else [0, 1]
            self.trial_dists = []
            finite0 = True
            t = 0
            while t < self.trials:  # fit_trials may lower self.trials after the first call
                dist = self.dists[t % _len(self.dists)]
                inputs = self.make_inputs(self.seed + t, dist)
                t0 = self.lap("reference: inputs", t0)
                out = ref(*inputs)
                self.sync()
                if t == 0:
                    ref64 = self.fit_trials(inputs, out, ref64)
                    finite0 = _len(self.dists) > 2 and _all_finite(out)
                    self.ref_aliased = _aliased_outputs(out, inputs)
                    sample0 = _output_sample(out)
                    dtype0 = next((o.dtype for o in _output_items(out)
                                   if _type(o) is _Tensor and _T_is_floating_point(o)), None)
                while dist >= 2 and finite0 and not _all_finite(out):
                    # The reference is not finite there: that distribution is left out.
                    del out, inputs
                    self.dists.remove(dist)
                    dist = self.dists[t % _len(self.dists)]
                    inputs = self.make_inputs(self.seed + t, dist)
                    out = ref(*inputs)
                    self.sync()
                self.trial_dists.append(dist)
                t0 = self.lap("reference: calls", t0)
                rounding = None
                if ref64 is not None:
                    rounding = self.rounding_error(ref64, inputs, out)
                    if rounding is None:
                        ref64 = None
                    t0 = self.lap("reference: float64 calls", t0)
                frames = []
                descs = _encode(out, frames, self.device, self.exports)
                t0 = self.lap("reference: outputs encoded", t0)
                msg = {"type": "reference", "trial": t, "distribution": dist, "outputs": descs, "trials": self.trials,
                       "input_bytes": self.input_bytes}
                if rounding is not None:
                    msg["rounding"] = rounding
                    slack = self.round_slack.setdefault(dist, [])
                    if _len(slack) < _len(rounding):
                        slack += [0.0] * (_len(rounding) - _len(slack))
                    for i, e in _enumerate(rounding):
                        slack[i] = _max(slack[i], self.rounding_factor * e)
                pending.append((msg, frames))
                for o in _output_items(out):
                    self.poison_tensor(o)
                del out, inputs, frames
                t += 1
            if ref64 is None:
                self.round_slack = {}  # the trials' messages may carry it; the rounds use none
                for msg, _ in pending:
                    msg.pop("rounding", None)
            del ref64
            # Calibrate kernel counting on the reference (e.g. CUPTI unavailable: no device events).
            inputs = self.make_inputs(self.seed, 0)
            out, counts = self.profiled(lambda: ref(*inputs))
            self.ref_profile = counts
            # The reference again on trial 0's inputs: a reference that keeps state between
            # calls (a recurrent model updating its hidden state in forward) or draws random
            # numbers of its own gives other outputs, and no candidate can be judged against it
            # (its trials, its determinism and its timed rounds assume one function).
            same, what = _same_sample(sample0, _output_sample(out),
                                      self.tolerances.get(dtype0, (0.0, 0.0)), self.round_slack.get(self.trial_dists[0], []))
            if not same:
                raise _Done("runtime_error", (),
                            "the task's reference is not deterministic: a second call on trial 0's inputs gave "
                            f"other outputs ({what}); it keeps state between calls or draws random numbers "
                            "of its own, and no candidate can be judged against it")
            for o in _output_items(out):
                self.poison_tensor(o)
            del out
            if self.cuda:
                if counts["device"] > 0:
                    self.kernel_mode = "device"
                elif counts["launches"] > 0:
                    self.kernel_mode = "launches"
                elif counts["ops"] > 0:
                    self.kernel_mode = "ops"
            elif counts["ops"] > 0:
                self.kernel_mode = "ops"
            t0 = self.lap("reference: poison and profiled call", t0)
            stage = f"while preparing the {self.baseline} baseline"
            self.prepare_baseline(inputs)
            del inputs
        except _BaseException as e:
            raise _error_done(e, stage) from None
        self.sync()
        t0 = self.lap("reference: baseline", t0)
        if self.exports is None:
            self.poison_free_pool()
            self.device_done(pending)
            self.lap("reference: outputs sent", t0)
            return
        # Outputs on the device: the evaluator copies them while it holds the device and says
        # so; the exported copies are then poisoned and freed before any candidate code exists.
        # First the pool's free blocks go back to the driver, poisoned: the float64 calls' and the
        # trials' buffers, which torch keeps cached, left no room for the evaluator's copies of
        # 4 GiB outputs on an 80 GB device (KernelBench level 1: 7, 84, 91-93), alone or not.
        self.poison_free_pool()
        _cuda_empty_cache()
        self.device_done(pending)
        msg = self.chan.recv()
        if msg.get("type") == "stop":
            _os_exit(0)
        if msg.get("type") != "taken":
            raise _Done("runtime_error", (), f"expected taken, got {msg.get('type')!r}")
        t0 = self.lap("reference: evaluator copies outputs", t0)
        # Poisoned now, freed when `run` arrives: the evaluator closes its mappings of them
        # meanwhile, and while they are allocated emptying torch's cache (which the candidate's
        # import could do) cannot return them to the driver.
        for x in self.exports:
            _T_fill_(x, 255)
        self.poison_free_pool()
        self.lap("reference: poison free pool", t0)

    def fit_trials(self, inputs, out, ref64):
        """CUDA: fewer correctness trials where their outputs would not fit the device. Each
        trial's outputs are held three times over (the reference's kept by the evaluator, its
        export until then, the candidate's), the float64 copy of the reference takes twice the
        inputs and outputs again, and other evaluations share the device: the trials' outputs may
        take half of the device's memory, the float64 calls a quarter. KernelBench's level 1 tasks
        have inputs and outputs of up to 6.4 GB each (19_ReLU: 4096 x 393216 float32), and five
        trials of those asked for more memory than an 80 GB device has. Returns ref64, or None
        where the float64 calls do not fit (the tolerances then stay fixed). The evaluator is told
        the number in every reference message and says it in the verdict."""
        in_bytes = _sum(_int(_T_numel(x)) * x.element_size() for x in _tensors_in(inputs))
        self.input_bytes = in_bytes  # in every reference message: the evaluator's retry alone
        if not self.cuda:
            return ref64
        try:
            total = torch.cuda.mem_get_info()[1]
        except _BaseException:
            return ref64
        out_bytes = _sum(_int(_T_numel(o)) * o.element_size() for o in _output_items(out) if _type(o) is _Tensor)
        fit = _max(1, _int((total // 2) // _max(3 * out_bytes, 1)))
        if fit < self.trials:
            self.laps["reference: trials the device holds"] = fit
            self.trials = fit
        if ref64 is not None and 2 * (in_bytes + out_bytes) > total // 4:
            self.laps["reference: no float64 copy (its calls would not fit the device)"] = 1
            return None
        return ref64

    def reference_float64(self, ref):
        """A copy of the reference in float64 (floating parameters and buffers), whose outputs
        on each trial's inputs say how far the reference's own rounding takes it from the exact
        result (rounding_error); None where rounding_factor is 0 or the copy cannot be made."""
        if self.rounding_factor <= 0:
            return None
        try:
            return copy.deepcopy(ref).to(torch.float64)
        except _BaseException as e:
            self.laps["reference: no float64 copy (" + _exc_line(e)[:120] + ")"] = 1
            return None

    def rounding_error(self, ref64, inputs, out):
        """Per output of the reference's call on `inputs` (`out`): the largest difference, over
        the elements finite in both, between it and the float64 copy's output on the same inputs
        in float64 (0 for outputs that are not floating tensors). None where the float64 call
        fails or gives outputs of another structure: the tolerances then stay fixed."""
        def wide(x):
            if _type(x) is _Tensor and _T_is_floating_point(x):
                return _T_to(x, torch.float64)
            return x

        try:
            with torch.no_grad():
                out64 = ref64(*[_map_tensors(x, wide) for x in inputs])
            a = _output_items(out)
            b = _output_items(out64)
            if _len(a) != _len(b):
                raise ValueError(f"{_len(b)} outputs in float64, {_len(a)} in the reference's dtype")
            errs = []
            for x, y in zip(a, b):
                if _type(x) is not _Tensor or not _T_is_floating_point(x):
                    errs.append(0.0)
                    continue
                if _type(y) is not _Tensor or _T_size(x) != _T_size(y):
                    raise ValueError("an output of another type or shape in float64")
                d = _torch_abs(_T_to(x, torch.float64) - _T_to(y, torch.float64))
                d = torch.where(_torch_isfinite(d), d, torch.zeros_like(d))
                errs.append(_float(d.max()) if _T_numel(d) else 0.0)
            self.sync()
            return errs
        except _BaseException as e:
            self.laps["reference: float64 call failed (" + _exc_line(e)[:120] + ")"] = 1
            return None

    def device_done(self, pending):
        """Tells the evaluator that this phase's device work is over, then sends the phase's
        buffered output messages: moving and comparing large outputs needs no device, so the
        evaluator can time another candidate meanwhile."""
        self.sync()
        self.chan.send({"type": "device_done"})
        for msg, frames in pending:
            self.chan.send(msg, frames)

    def prepare_baseline(self, inputs):
        ref = self.ref
        if self.baseline == "eager":
            self.ref_fn = ref
            return
        if self.baseline in ("compile", "compile-reduce-overhead"):
            mode = "reduce-overhead" if self.baseline == "compile-reduce-overhead" else None
            compiled = torch.compile(ref, mode=mode)
            self.mark_step = torch.compiler.cudagraph_mark_step_begin if mode else None
            for _ in _range(3):
                if self.mark_step is not None:
                    self.mark_step()
                out = compiled(*inputs)
                del out
            self.sync()
            self.ref_fn = compiled
            return
        # cuda-graph: capture the reference on static input buffers.
        static = _clone_inputs(inputs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in _range(3):
                ref(*static)
        torch.cuda.current_stream().wait_stream(side)
        self.sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = ref(*static)
        self.sync()
        self.graph = (graph, static, static_out)
        self.ref_fn = None

    def load_phase(self, src):
        t0 = _perf_counter_ns()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # reading deprecated module attributes warns
            self.core, self.full = _snapshots(globals(), self.early_snapshots)
            self.early_snapshots = None
            # The task's module and class: the reference is timed after the candidate ran.
            self.core.add_module("task", self.task, "callables")
            self.core.add_class(self.task.Model)
        self.flags0 = self.flags()
        py0 = _py_threads()
        self.load_os0 = _os_threads()
        t0 = self.lap("load: snapshots", t0)
        # The candidate's module: syntax errors, import errors and extension build failures.
        # load_inline and load calls made while the module executes are built by the evaluator
        # (_keyed_build): the request goes out on the channel, the reply names the cache entry.
        global _BUILD_SERVICE
        _BUILD_SERVICE = self.request_build
        try:
            _reseed_visible()
            self.cand_mod = self.exec_module("crucible_candidate", src, "candidate.py")
        except _BaseException as e:
            if _isinstance(e, _Done):
                raise
            if _isinstance(e, SyntaxError):
                raise _Done("compile_error", (), "syntax error: " + _tail("".join(_format_exception_only(_type(e), e)), 8)) from None
            text = _str(e)
            if "Error building extension" in text or "ninja" in text.lower():
                raise _Done("compile_error", (), "extension build failed:\n" + _tail(text, 40)) from None
            if _is_oom(e):
                raise _Done("runtime_error", (), "out of memory while importing the candidate: " + _exc_line(e)) from None
            raise _Done("compile_error", (), "the candidate module failed to import:\n" + _exc_text(e)) from None
        finally:
            _BUILD_SERVICE = None
        t0 = self.lap("load: candidate module", t0)
        self.check_state("after the candidate module executed")
        self.check_full("after the candidate module executed")
        self.check_threads_load(py0, "while the candidate module executed")
        self.lap("load: snapshot checks", t0)
        cls = _getattr(self.cand_mod, "ModelNew", None)
        if not _isinstance(cls, type):
            raise _Done("compile_error", (), "the candidate defines no class ModelNew")
        if self.static:
            self.check_signature(cls)
        self.cand_cls = cls
        self.load_py0 = py0

    def construct_model(self):
        """ModelNew(*get_init_inputs()) on the device, once the evaluator holds it."""
        cls = self.cand_cls
        py0 = self.load_py0
        try:
            _torch_manual_seed(self.seed)
            init = _list(self.task.get_init_inputs())
            self.candidate_flags()
            model = cls(*init)
            model = model.to(self.device)
            if self.eval_mode:
                model.eval()
            self.sync()
        except _BaseException as e:
            raise _error_done(e, "while constructing ModelNew") from None
        self.model = model
        self.check_state("after ModelNew was constructed")
        self.check_threads_load(py0, "while ModelNew was constructed")

    def check_threads_load(self, before, where):
        now = _py_threads()
        if now[0] > before[0] or now[1] > before[1]:
            raise _Done("rejected", ["runtime:threads"],
                        f"the candidate started Python threads {where} ({before[0]} -> {now[0]}: "
                        f"{_thread_names() or 'threads unknown to threading'})")
        # Threads started from C++ (an extension's static initialiser or constructor): the
        # runtimes start theirs lazily in the first call, not while a module loads.
        os0 = self.load_os0
        if os0 >= 0:
            os1 = _os_threads()
            if os1 > os0:
                raise _Done("rejected", ["runtime:threads"],
                            f"the candidate left {os1 - os0} new OS thread(s) running {where}")

    def check_signature(self, cls):
        def params(c):
            sig = _signature(c.__init__)
            return _list(sig.parameters.values())[1:]  # without self

        try:
            want = params(self.task.Model)
            got = params(cls)
        except (TypeError, ValueError) as e:
            raise _Done("rejected", ["static:hyperparameters"], f"cannot read ModelNew.__init__'s signature: {e}")

        def same_default(a, b):
            if a is _param_empty or b is _param_empty:
                return a is b
            try:
                return _bool(a == b)
            except Exception:
                return _repr(a) == _repr(b)

        # get_init_inputs() binds by position: a positional parameter may be renamed
        # (input_size -> in_features), its position, kind and default may not change.
        positional = (_param_positional_only, _param_positional_or_keyword)
        ok = _len(want) == _len(got) and all(
            (w.name == g.name or w.kind in positional)
            and w.kind == g.kind and same_default(w.default, g.default)
            for w, g in zip(want, got))
        if not ok:
            fmt = lambda ps: "(" + ", ".join(_str(p) for p in ps) + ")"  # noqa: E731
            raise _Done("rejected", ["static:hyperparameters"],
                        f"ModelNew.__init__{fmt(got)} differs from Model.__init__{fmt(want)}: "
                        "constructor arguments and defaults must not change")

    # -- candidate calls ---------------------------------------------------------------------
    def call_candidate(self, inputs, where, check_os_threads=True, profile=False):
        py0 = _py_threads()
        os0 = _os_threads()
        counts = None
        _reseed_visible()
        self.candidate_flags()
        if self.timing_now:
            self.foreign_mark(True)
        try:
            if profile:
                out, counts = self.profiled(lambda: self.model(*inputs))
            else:
                out = self.model(*inputs)
                if self.timing_now:
                    self.foreign_mark(False)
                self.sync()
        except _BaseException as e:
            raise _error_done(e, f"in ModelNew.forward ({where})") from None
        self.after_call(py0, os0, where, check_os_threads)
        return out, counts

    def after_call(self, py0, os0, where, check_os_threads):
        py1 = _py_threads()
        if py1[0] != py0[0] or py1[1] != py0[1]:
            raise _Done("rejected", ["runtime:threads"],
                        f"{where}: Python threads {py0[0]} before the candidate's forward, {py1[0]} after "
                        f"({py0[1]} -> {py1[1]} thread states; other threads: {_thread_names() or 'none'})")
        if check_os_threads and os0 >= 0:
            os1 = _os_threads()
            if os1 > os0:
                raise _Done("rejected", ["runtime:threads"],
                            f"{where}: the candidate's forward left {os1 - os0} new OS thread(s) running")
        self.check_state(where)

    def trial_phase(self):
        pending = []
        # The OS threads before the candidate's first call, which may start threads (the
        # runtimes start theirs lazily there); any other thread is watched in the timing rounds.
        base = _tids()
        me = _get_native_id()
        if base is not None and me in base and _thread_cpu_ns(me) is not None:
            self.thread_base = base
        else:
            self.laps["timing: foreign threads check unavailable"] = 1
        for t in _range(self.trials):
            inputs = self.make_inputs(self.seed + t, self.trial_dists[t])
            if self.jitter_bytes >= 512:  # placed as the timed calls' inputs are: nothing tells them apart
                inputs = self.placed(inputs)
            pristine = _clone_inputs(inputs)
            layout = _input_layout(inputs)
            before = _active_count()
            where = f"trial {t}"
            out, _ = self.call_candidate(inputs, where, check_os_threads=t > 0)
            aliased = _aliased_outputs(out, inputs)
            frames = []
            msg = {"type": "candidate", "trial": t, "distribution": self.trial_dists[t],
                   "outputs": _encode(out, frames, self.device, self.exports)}
            del out
            unchanged = _inputs_unchanged(inputs, layout, pristine)
            if t > 0 and unchanged:  # a changed input is the evaluator's runtime:input_mutation
                self.check_aliasing(aliased, where)
            if t == 0:
                # Determinism, and kernel counting on a second call with the same inputs (a
                # candidate that caches by pointer or identity launches nothing here).
                out, counts = self.call_candidate(inputs, where + ", second call", check_os_threads=False,
                                                  profile=True)
                msg["repeat_outputs"] = _encode(out, frames, self.device, self.exports)
                del out
                unchanged = unchanged and _inputs_unchanged(inputs, layout, pristine)
                if self.kernel_mode is not None:
                    n = self.kernel_count(counts)
                    if n == 0:
                        raise _Done("rejected", ["runtime:no_kernel"],
                                    "no kernel or operator ran in the candidate's forward "
                                    f"(profiled on the second call of trial 0; counted {self.kernel_mode})")
                    msg["kernels"] = n
                own = self.own_work(counts)
                if own is not None:
                    msg["own_kernels"] = own
                self.check_device_time(counts, where + ", second call")
                if unchanged:  # after the kernel count
                    self.check_aliasing(aliased, where)
            msg["inputs_unchanged"] = unchanged
            msg["threads_before"] = before
            msg["threads_after"] = _active_count()
            pending.append((msg, frames))
            del inputs, pristine, frames
        self.device_done(pending)

    def check_aliasing(self, aliased, where):
        """runtime:aliased_output: an output that shares memory with an input where the
        reference's (on the task's own inputs) does not. A view of an input runs no computation,
        and on inputs for which it happens to be right it would be credited as a kernel."""
        for i, a in _enumerate(aliased):
            if a and not (i < _len(self.ref_aliased) and self.ref_aliased[i]):
                raise _Done("rejected", ["runtime:aliased_output"],
                            f"{where}: output {i} shares memory with an input, where the reference's output does "
                            "not; returning an input or a view of one is not a computation")

    # -- timing ------------------------------------------------------------------------------
    def timed_reference(self, inputs, k, inside=False):
        """One timed sample of the reference: a call on each entry of `inputs` (a list of input
        lists), back to back between one start and one stop; with `inside`, the same snapshots as
        the candidate's in-sample ones are taken after every call but the last and dropped, so
        that both samples hold the same work. Returns ((synced, stream) ms per call, the list of
        the calls' outputs)."""
        n = _len(inputs)
        try:
            fn = self.ref_fn
            static_out = None
            if self.baseline == "cuda-graph":  # one call per sample (choose_calls)
                graph, static, static_out = self.graph
                for s, x in zip(static, inputs[0]):
                    if _isinstance(s, _Tensor):
                        _T_copy_(s, x)
                fn, inputs = graph.replay, [()]
            elif self.baseline == "compile-reduce-overhead" and self.mark_step is not None:
                self.mark_step()  # one call per sample with this baseline (choose_calls)
            if self.cuda:
                outs, _, gated = self.gated_calls(fn, inputs, inside, k)
                ms = self.finish_sample(gated, n)
                return ms, ([static_out] if static_out is not None else outs)
            self.flush(k)
            t0 = _perf_counter_ns()
            outs, _ = _call_all(fn, inputs, inside, self.snapshot_inside)
            t1 = _perf_counter_ns()
            ms = (t1 - t0) / 1e6 / n
            self.host_ms = ms
            return (ms, ms), outs
        except _BaseException as e:
            raise _error_done(e, "in the reference during timing") from None

    def elapsed(self, n):
        """(synced, stream) milliseconds per call of the `n` calls just timed: from the start
        event to the stop event recorded after the device-wide synchronisation, and to the event
        recorded on the stream right after the last call returned, each divided by `n`. The
        evaluator settles the pair (env/timing.hpp, settle_rounds): the first counts every stream
        but also the host's wake-up after the synchronisation, which differs from process to
        process."""
        return _Ev_elapsed(self.ev0, self.ev1) / n, _Ev_elapsed(self.ev0, self.ev_call) / n

    def timed_candidate(self, inputs, k, where, checked=1, inside=False):
        """One timed sample of the candidate: a call on each entry of `inputs` (a list of input
        lists), back to back between one start and one stop. Returns ((synced, stream) ms per
        call, ([(call index, snapshot, in-sample)], the calls' output pointers), the fewest
        output bytes among the checked calls).

        With `inside`, every call but the last has its outputs snapshotted inside the sample,
        right after it returns (_INSIDE_SAMPLE elements of each): the gather is queued on the
        stream behind the call's work, so it sees what the call left in its outputs before any
        later call ran (the reference's sample takes the same snapshots). A candidate that hands
        back one buffer and fills it only on some calls (the last of a sample, or whichever a
        device-side counter says is the newest), or leaves a call's work to a later call, fails
        there; and since every call is snapshotted, no call can learn (from the host's timing
        between calls, or on the device) which ones are. `checked` calls drawn at random are
        snapshotted in full as the clock stops, before anything else; every call's outputs are
        alive until then, and one that shares its buffer with later calls is checked against the
        last call that returned it (_checked_reference)."""
        model = self.model
        n = _len(inputs)
        py0 = _py_threads()
        os0 = _os_threads()
        _reseed_visible()
        self.candidate_flags()
        self.foreign_mark(True)
        try:
            if self.cuda:
                # The stream's stop comes before the harness's own bookkeeping (the thread watch):
                # its host time is no part of the candidate's calls (the reference has none).
                outs, inner, gated = self.gated_calls(model, inputs, inside, k)
                self.foreign_mark(False)
                ms = self.finish_sample(gated, n)
            else:
                self.flush(k)
                t0 = _perf_counter_ns()
                outs, inner = _call_all(model, inputs, inside, self.snapshot_inside)
                t1 = _perf_counter_ns()
                self.foreign_mark(False)
                ms = (t1 - t0) / 1e6 / n
                self.host_ms = ms
                ms = (ms, ms)
            picks = self.check_indices(n, checked)
            snaps = [(i, self.snapshot(outs[i]), False) for i in picks]
            nbytes = _min(_output_bytes(outs[i]) for i in picks)
            snaps.extend((i, snap, True) for i, snap in inner)
            aliased = [_aliased_outputs(out, x) for out, x in zip(outs, inputs)]
            storages = [_output_storages(out) for out in outs]
        except _BaseException as e:
            raise _error_done(e, f"in ModelNew.forward ({where})") from None
        del outs
        self.after_call(py0, os0, where, True)
        for a in aliased:
            self.check_aliasing(a, where)
        return ms, (snaps, storages), nbytes

    def check_indices(self, n, checked):
        """`checked` distinct call indices of a sample of `n` calls, drawn from the harness's
        generator (all of them when n <= checked)."""
        if n <= checked:
            return _list(_range(n))
        picks = _set()
        while _len(picks) < checked:
            picks.add(_int(self.rng_random() * n))
        return _sorted(picks)

    def foreign_mark(self, outside):
        """Threads the candidate started in its first calls (any OS thread not there before
        trial 0) may work inside its calls only. Called as a candidate call of the timing rounds
        starts (outside=True: the span since the last mark was outside the candidate's calls,
        where the harness and the reference ran) and as its forward returns (outside=False, only
        the known threads' clocks: nothing is added to the call's time where there are none).
        A thread that gained CPU time outside the calls, or began or ended there, marks the
        round: such a thread could load the device or the cores while the reference is timed,
        or launch work after the candidate's clock stopped (runtime:threads, check_foreign)."""
        if self.thread_base is None:
            return
        prev = self.foreign
        if outside or prev is None:
            tids = _tids()
            if tids is None:
                return
            now = {}
            for tid in tids - self.thread_base:
                ns = _thread_cpu_ns(tid)
                if ns is not None:
                    now[tid] = ns
        else:
            now = {}
            for tid in prev:
                ns = _thread_cpu_ns(tid)
                if ns is not None:
                    now[tid] = ns
        self.foreign = now
        if prev is None or not outside:
            return
        ran = 0
        changed = _len(now) != _len(prev)
        for tid, ns in now.items():
            if tid in prev:
                ran += ns - prev[tid]
            else:
                changed = True
                ran += ns
        if ran > 0 or changed:
            self.foreign_rounds.add(_max(self.round_no - 1, 0))  # the first calls count with round 0
            self.foreign_ns += ran

    def check_foreign(self, rounds):
        """runtime:threads when threads of the candidate ran outside its calls in two or more of
        the timing rounds so far (one is let pass: a thread finishing what it began in the first
        calls). `rounds`: how many rounds have begun."""
        if self.foreign_rounds:
            self.laps["timing: rounds with foreign thread activity"] = _len(self.foreign_rounds)
            self.laps["timing: foreign thread CPU (us)"] = self.foreign_ns / 1e3
        if _len(self.foreign_rounds) >= 2:
            raise _Done("rejected", ["runtime:threads"],
                        f"a thread the candidate started in its first calls ran outside its calls, while the "
                        f"harness and the reference ran, in {_len(self.foreign_rounds)} of {rounds} timing rounds "
                        f"({self.foreign_ns / 1e3:.0f} us of CPU time); a candidate's threads may only work "
                        "inside its own calls")

    def snapshot_inside(self, out):
        """snapshot() of _INSIDE_SAMPLE elements of each output, inside a timed sample."""
        return self.snapshot(out, _INSIDE_SAMPLE)

    def snapshot(self, out, samples=_ROUND_SAMPLE):
        """The outputs of a timed call as they are when its clock stops, taken before anything
        else the harness does: for each plain tensor output, its values at up to _ROUND_SAMPLE
        positions drawn now, after the call, from a generator the candidate cannot reach (on
        CUDA, a gather queued on the timing stream right after the device-wide synchronisation).
        Work that a thread of the candidate finishes after the call returned, unseen by the
        clock, is missing from the snapshot. Returns one entry per output (_output_items): the
        output itself where it is not a plain tensor, else a _Taken."""
        snap = []
        for y in _output_items(out):
            if _type(y) is not _Tensor:
                snap.append(y)
                continue
            n = _T_numel(y)
            size = _tuple(_T_size(y))
            if n == 0:
                snap.append(_Taken(None, None, size, y.dtype))
                continue
            if _KERNELS is not None and y.device.type == "cuda" and _KERNELS.supports(y):
                seed = self.sample_bits(64)
                yc = y if _T_is_contiguous(y) else _T_contiguous(y)
                snap.append(_Taken(_KERNELS.gather(yc, seed, samples), seed, size, y.dtype))
                continue
            ys = _T_reshape(_T_detach(y), (-1,))
            if n > samples and samples < _ROUND_SAMPLE:
                # Inside a sample, without the harness kernels (the CPU): a window of `samples`
                # elements at a random place, one copy. Drawing positions and gathering them cost
                # as much as a small call, and their varying cost inside both samples widened the
                # CPU suite's bands from about ±10% to ±25-57%. A call that left its outputs
                # unwritten, or any part of them, is caught where the window falls on it.
                start = _int(self.rng_random() * (n - samples + 1))
                where = slice(start, start + samples)
                snap.append(_Taken(_T_clone(ys[where]), where, size, y.dtype))
                continue
            if n > samples:
                idx = _torch_randint(0, n, (samples,), generator=self.sample_gen, device=y.device)
                snap.append(_Taken(_torch_index_select(ys, 0, idx), idx, size, y.dtype))
            else:
                snap.append(_Taken(_T_clone(ys), None, size, y.dtype))
        return snap

    def check_round_outputs(self, ref_out, snap, k):
        """Every timed call's outputs are held to the correctness tolerance against the
        reference's on the same inputs (a candidate that computes less, or in lower precision,
        only when it is timed fails here: runtime:timing_outputs). `snap` is the candidate's
        snapshot (snapshot()): outputs larger than _ROUND_SAMPLE elements are compared at that
        many positions drawn after the call, so the candidate cannot know which elements are
        checked; comparing every element in float64 took longer than the timed calls themselves.

        Type, shape and dtype are checked here; the count of differing elements is computed on
        the device and kept (self.round_fracs), and read once per measurement by
        check_round_fracs(): reading it every round waited for the device each time."""
        a = _output_items(ref_out)
        bad = _len(a) != _len(snap)
        detail = "a different number of outputs"
        for i, (x, y) in _enumerate(zip(a, snap)):
            if bad:
                break
            if _type(y) is not _Taken or _type(x) is not _Tensor:
                bad = _type(x) is not _type(y) or _type(x) is _Tensor
                detail = "an output of another type"
                continue
            taken, where, size, dtype = y.values, y.where, y.size, y.dtype
            if x.dtype != dtype or _tuple(_T_size(x)) != size:
                bad, detail = True, "an output of another shape or dtype"
                continue
            if taken is None:
                continue
            if _type(where) is _int:
                self.check_round_output_kernels(i, x, taken, where, k)
                continue
            xs = _T_reshape(x, (-1,))
            if _type(where) is slice:
                xs = xs[where]
            elif where is not None:
                xs = _torch_index_select(xs, 0, where)
            if _T_is_floating_point(xs):
                # |y - x| <= atol + rtol * |x| in float64, NaN matching NaN (env/compare.cpp).
                atol, rtol = self.tolerance(x.dtype, i)
                ok = _torch_isclose(_T_to(taken, torch.float64), _T_to(xs, torch.float64), rtol=rtol, atol=atol,
                                    equal_nan=True)
            else:
                ok = _torch_eq(xs, taken)
            self.round_fracs.append((k, i, _T_numel(ok), _torch_count_nonzero(ok)))
        if bad:
            self.round_failed(k, detail)

    def check_round_output_kernels(self, i, x, taken, seed, k):
        """check_round_outputs for one output with the harness's own kernels: the reference's
        values at the positions drawn from `seed` against the candidate's snapshot, the same
        tolerance, and the mismatches counted into a slot of self.round_bad (read by
        check_round_fracs)."""
        if not _T_is_contiguous(x):
            x = _T_contiguous(x)
        atol, rtol = self.tolerance(x.dtype, i)
        if self.round_used == _ROUND_SLOTS:
            self.check_round_fracs()
        slot = self.round_used
        self.round_used += 1
        # The snapshot's size says how many positions it drew (all of them, in order, when the
        # output had no more elements than that).
        samples = _T_numel(taken)
        _KERNELS.round_check(x, taken, seed, samples, atol, rtol, _T_data_ptr(self.round_bad) + 8 * slot)
        self.round_fracs.append((k, i, samples, slot))

    def tolerance(self, dtype, i):
        """(atol, rtol) of the correctness comparison for output `i`, of `dtype` (env/compare.cpp:
        exact for the dtypes it names no tolerance for), atol widened by the reference's own
        rounding error on that output (round_slack) as the evaluator widens it for the trials."""
        atol, rtol = self.tolerances.get(dtype, (0.0, 0.0))
        if i < _len(self.cur_slack) and (atol > 0 or rtol > 0):
            atol += self.cur_slack[i]
        return atol, rtol

    def round_failed(self, k, detail):
        raise _Done("rejected", ["runtime:timing_outputs"],
                    f"timing round {k}: the candidate's output differs from the reference's on the same "
                    f"inputs ({detail}); every timed call is checked like a correctness trial")

    def check_round_fracs(self):
        """The kept counts of differing elements (check_round_outputs), read in one transfer."""
        fracs = self.round_fracs
        self.round_fracs = []
        if not fracs:
            return
        counted = [m for _, _, _, m in fracs if _type(m) is not _int]
        matching = _T_tolist(_torch_stack(counted)) if counted else []
        used = self.round_used if _KERNELS is not None and self.cuda else 0
        mismatches = _T_tolist(self.round_bad[:used]) if used else []
        if used:
            _KERNELS._zero(_T_data_ptr(self.round_bad), used * 8)
            self.round_used = 0
        it = iter(matching)
        for k, i, n, m in fracs:
            bad = mismatches[m] if _type(m) is _int else n - next(it)
            if bad > 0:
                self.round_failed(k, f"{bad} of {n} checked elements of output {i} beyond the correctness tolerance")

    def prime_reference(self, inputs):
        """An untimed call of the reference right before its timed sample (see timing()),
        waited for like the candidate's (whose side-stream work would otherwise be counted in
        its sample). When nothing waited for it, the host queued the reference's timed calls
        while the device still ran the priming call, so a reference of many small kernels was
        timed without the host's launch gaps that the candidate's sample paid: identical code
        came out slower as the candidate."""
        try:
            if self.baseline == "cuda-graph":
                self.graph[0].replay()
            else:
                if self.mark_step is not None:
                    self.mark_step()
                out = self.ref_fn(*inputs)
                del out
            self.sync()
        except _BaseException as e:
            raise _error_done(e, "in the reference during timing") from None

    def placed(self, inputs, jitter_bytes=None):
        """A copy of `inputs` whose contiguous tensors each start 0 to `jitter_bytes`
        (self.jitter_bytes by default; in 512-byte steps) into a fresh allocation of their size
        plus that lead; other tensors are cloned. The caching allocator hands back blocks of the
        sizes a round frees, so new allocations alone land at the same few addresses round after
        round (4 over 33 rounds on an H100); the random lead moves every round's inputs."""
        jitter = self.jitter_bytes if jitter_bytes is None else jitter_bytes
        if jitter < 512:
            return _clone_inputs(inputs)
        steps = jitter // 512

        def place(t):
            if _type(t) is not _Tensor or t.requires_grad or not _T_is_contiguous(t):
                return _T_clone(t)
            lead = _int(self.rng_random() * (steps + 1)) * 512
            size = _int(_T_numel(t)) * t.element_size()
            buf = _torch_empty(lead + size, dtype=_uint8, device=t.device)
            y = _torch_empty(0, dtype=t.dtype, device=t.device)
            _T_set_(y, _T_untyped_storage(buf), lead // t.element_size(), _T_size(t), _T_stride(t))
            _T_copy_(y, t)
            return y

        return [_map_tensors(x, place) for x in inputs]

    def prime_candidate(self, inputs, where):
        out, _ = self.call_candidate(inputs, where + ", untimed priming call")
        del out

    def one_round(self):
        """One paired round: each model timed once, in random order, on a sample of self.calls
        calls, each call on its own fresh inputs; returns ((synced, stream) ms per call of the
        reference, the same of the candidate, candidate first)."""
        k = self.round_no
        self.round_no += 1
        t_round = _perf_counter_ns()
        n = self.calls
        # Fresh values at fresh addresses: the previous round's inputs are still alive while
        # these are generated, outside the timed region; each model gets its own copy.
        # Seeded from the operating system, drawn now: no state of this process predicts them.
        # Every call of a sample has its own: no call can reuse another's work.
        dist = self.dists[k % _len(self.dists)]
        fresh = [self.make_inputs(_fresh_seed(), dist) for _ in _range(n)]
        # The slack of this distribution's trials; the largest of all where no trial drew it.
        self.cur_slack = self.round_slack.get(dist) or [_max(v) for v in zip(*self.round_slack.values())]
        if self.jitter_bytes >= 512:  # both copies at random places (docs/evaluator.md, Timing: placement)
            # A sample's calls share the jitter: n leads of up to jitter / n bytes each.
            jitter = self.jitter_bytes // n
            ref_in = [self.placed(x, jitter) for x in fresh]
            cand_in = [self.placed(x, jitter) for x in fresh]
        else:
            ref_in = fresh
            cand_in = [_clone_inputs(x) for x in fresh]
        for x in cand_in[0]:
            if _isinstance(x, _Tensor):
                self.placements.add(_T_data_ptr(x))
                break
        prev_ref, prev_cand = self.prime_inputs
        # Order in balanced pairs: a random order, then the other one. Some pairs showed a
        # steady order effect (on an H100, layernorm's per-round ratio alternated 5.4x/5.6x by
        # order); with independent coin flips a bucket of rounds holds an uneven mix and its mean
        # moves with it, while a bucket of whole pairs holds both orders equally.
        if self.pair_first is None:
            cand_goes_first = self.rng_random() < 0.5
            self.pair_first = cand_goes_first
        else:
            cand_goes_first = not self.pair_first
            self.pair_first = None
        where = f"timing round {k}"
        # Every call but the last is snapshotted inside both samples (timed_candidate).
        inside = n > 1
        t0 = self.lap("round: inputs", t_round)
        # Each timed sample directly follows an untimed call of the same model on the previous
        # round's inputs. Without it, whichever call came first in a round ran 8-15% slower
        # (host-side state after generating the inputs; measured on an H100), which random
        # order turned into +-10% of noise on the speedup.
        if cand_goes_first:
            self.prime_candidate(prev_cand, where)
            t0 = self.lap("round: candidate priming", t0)
            c_ms, c_out, c_bytes = self.timed_candidate(cand_in, 2 * k, where, _ROUND_CHECKS, inside)
            t0 = self.lap("round: candidate timed", t0)
            self.prime_reference(prev_ref)
            t0 = self.lap("round: reference priming", t0)
            r_ms, r_outs = self.timed_reference(ref_in, 2 * k + 1, inside)
            t0 = self.lap("round: reference timed", t0)
        else:
            self.prime_reference(prev_ref)
            t0 = self.lap("round: reference priming", t0)
            r_ms, r_outs = self.timed_reference(ref_in, 2 * k, inside)
            t0 = self.lap("round: reference timed", t0)
            self.prime_candidate(prev_cand, where)
            t0 = self.lap("round: candidate priming", t0)
            c_ms, c_out, c_bytes = self.timed_candidate(cand_in, 2 * k + 1, where, _ROUND_CHECKS, inside)
            t0 = self.lap("round: candidate timed", t0)
        # The floor counts the outputs of checked calls only (the other calls' outputs are not).
        self.floor_bytes = c_bytes if self.floor_bytes is None else _min(self.floor_bytes, c_bytes)
        snaps, storages = c_out
        try:
            for i, snap, in_sample in snaps:
                ref = _output_items(r_outs[i]) if in_sample else _checked_reference(r_outs, storages, i)
                self.check_round_outputs(ref, snap, k)
        except _Done:
            raise
        except _BaseException as e:
            raise _error_done(e, f"comparing the outputs of {where}") from None
        t0 = self.lap("round: output check", t0)
        del r_outs, c_out, snaps
        # Kept alive until the next round's inputs exist (fresh addresses), and used for the
        # next round's priming calls.
        self.prime_inputs = (ref_in[-1], cand_in[-1])
        del fresh, ref_in, cand_in, prev_ref, prev_cand
        self.lap("round: previous inputs freed", t0)
        return r_ms, c_ms, cand_goes_first

    def choose_calls(self, ref_ms, cand_ms, in_bytes, out_bytes, inputs_ms, host_ms=0.0):
        """Calls per timed sample: as many as make the faster model's sample last
        self.sample_ms, at most self.max_calls; fewer where a round's inputs and outputs for
        both models would take more than a quarter of the device's free memory (1 GiB on the
        CPU) or drawing the inputs more than _INPUTS_MS_PER_ROUND of host time; one with sample_ms
        0 and with the graph baselines: cuda-graph copies its static inputs before each replay,
        and compile-reduce-overhead's graphs overwrite their outputs at the next step, where a
        sample keeps every call's outputs. `ref_ms`, `cand_ms`: the first calls' stream times."""
        if self.sample_ms <= 0 or self.baseline in ("cuda-graph", "compile-reduce-overhead"):
            return 1
        fastest = _max(_min(_sorted(ref_ms)[_len(ref_ms) // 2], _sorted(cand_ms)[_len(cand_ms) // 2]), 1e-6)
        calls = _min(self.max_calls, _max(1, _int(-(-self.sample_ms // fastest))))
        per_call = 2 * (in_bytes + out_bytes) + 1
        budget = 1 << 30
        if self.cuda:
            try:
                budget = torch.cuda.mem_get_info()[0] // 4
            except _BaseException:
                pass
        calls = _min(calls, _max(1, budget // per_call))
        if inputs_ms > 0:
            calls = _min(calls, _max(1, _int(_INPUTS_MS_PER_ROUND // inputs_ms)))
        if self.cuda and host_ms > 0:  # the host queues a sample well within the gate's wait
            calls = _min(calls, _max(1, _int(_GATE_HOST_MS // host_ms)))
        return calls

    def clock_warmup(self, cap_ms):
        """CUDA: keeps the device busy with spin kernels until its SM clock stops rising (for at
        most cap_ms), and logs the clock reached. A spin of C cycles takes C / f, so each batch's
        elapsed time gives the clock f. The paired rounds keep the device busy only part of the
        time, so they alone may leave a clock low after idle seconds. (It did not remove the
        1.5-2.5% slower first verdicts of a 0.26 ms kernel on an H100, which it was tried for: the
        clock was already at 1938 of 1980 MHz there.) Settled: a batch no more than 0.5% faster
        than the fastest before it, after at least _CLOCK_MIN_MS of spinning."""
        if not self.cuda or not self.can_spin:
            return
        t0 = _perf_counter_ns()
        best = 0.0
        spun = 0.0
        batches = 0
        while True:
            _Ev_record(self.ev0, self.stream0)
            for _ in _range(_CLOCK_BATCH):
                self.spin(_LAUNCH_COVER_CYCLES)
            _Ev_record(self.ev1, self.stream0)
            _Ev_synchronize(self.ev1)
            ms = _Ev_elapsed(self.ev0, self.ev1)
            spun += ms
            batches += 1
            mhz = _CLOCK_BATCH * _LAUNCH_COVER_CYCLES / (ms * 1e3) if ms > 0 else 0.0
            if spun >= _CLOCK_MIN_MS and mhz <= best * 1.005:
                break
            best = _max(best, mhz)
            if (_perf_counter_ns() - t0) >= cap_ms * 1e6:
                break
        self.laps["timing: clock warm-up batches"] = self.laps.get("timing: clock warm-up batches", 0) + batches
        self.laps["timing: SM clock after warm-up (MHz)"] = mhz

    def await_measure(self):
        """Says the warm-up is over and waits for the evaluator's word to begin the measured
        rounds (it lets starting workers' context creations finish first; docs/evaluator.md,
        Timing). On CUDA the device spins meanwhile, so that its clocks stay up."""
        t0 = _perf_counter_ns()
        self.chan.send({"type": "warmed"})
        if self.cuda and self.can_spin:
            msg = None
            while msg is None:
                for _ in _range(5):
                    self.spin(_LAUNCH_COVER_CYCLES)
                _cuda_synchronize()
                msg = self.chan.poll()
        else:
            msg = self.chan.recv()
        if msg.get("type") == "stop":
            _os_exit(0)
        if msg.get("type") != "measure":
            raise _Done("runtime_error", (), f"expected measure, got {msg.get('type')!r}")
        self.lap("timing: waiting to measure", t0)

    def reserve_for_rounds(self, inputs):
        """CUDA: one allocation for the timing rounds' buffers, handed back to torch's caching
        allocator at once. Each round copies its inputs into blocks of their size plus a random
        lead; blocks the trials left behind are too small for those, so without it each new size
        asked the driver for memory, in the first rounds above all and sometimes inside a timed
        call. Blocks cut from one large free block need no driver call."""
        t0 = _perf_counter_ns()
        nbytes = _sum(_int(_T_numel(t)) * t.element_size() for t in _tensors_in(inputs))
        want = 8 * nbytes + 4 * self.jitter_bytes
        try:
            free, _total = torch.cuda.mem_get_info()
            want = _min(want, free // 2)
            if want >= (64 << 20):
                block = _torch_empty(want, dtype=_uint8, device="cuda")
                del block
        except _BaseException:
            pass  # an optimisation only: the rounds then allocate as they go
        self.laps["timing: reserved MiB"] = want / (1 << 20)
        self.lap("timing: reserve", t0)

    def measure_floor(self):
        """The physics floor of a timed call (KernelGuard's): half the fastest of five fills of
        as many bytes as the candidate's outputs held (_output_bytes; the fewest of its calls in
        the rounds so far, whose outputs are all checked), timed as a timed call is (after the
        cache flush and, on CUDA, from the start event on the timing stream to the event after
        the fill). No call can produce its outputs faster than the device writes them, nor in
        less than one launch, which the fill also takes; the half leaves room for a fill slower
        than the best possible writes. Measured once, after the first measured rounds; sent
        with every measurement, and the evaluator compares the candidate's median settled time
        with it (runtime:below_floor, env/evaluator.cpp)."""
        t0 = _perf_counter_ns()
        nbytes = _max(_int(self.floor_bytes or 0), 1)
        buf = _torch_empty(nbytes, dtype=_uint8, device=self.device)
        best = None
        n = self.calls  # fills back to back, as many as a timed sample's calls

        def fill():
            if _KERNELS is not None:
                _KERNELS._zero(_T_data_ptr(buf), nbytes)
            else:
                _T_zero_(buf)

        for i in _range(5):
            if self.cuda:
                # The fills behind the gate, back to back, as a sample's calls are.
                _, _, gated = self.gated_calls(fill, [()] * n, False, -10 - i)
                _Ev_synchronize(self.ev_call)
                self.gate_outcome(gated)
                ms = _Ev_elapsed(self.ev0, self.ev_call) / n
            else:
                self.flush(-10 - i)
                t1 = _perf_counter_ns()
                for _ in _range(n):
                    fill()
                ms = (_perf_counter_ns() - t1) / 1e6 / n
            best = ms if best is None else _min(best, ms)
        del buf
        self.floor_ms = 0.5 * best
        self.laps["timing: floor (us)"] = self.floor_ms * 1e3
        self.laps["timing: floor bytes"] = nbytes
        self.lap("timing: floor", t0)

    def timing(self, rounds, warmup_ms, warmup_rounds=3, announce=False):
        """Warm-up and `rounds` measured rounds (timing_rounds), with the cyclic garbage
        collector off under evaluator.quiet_gc."""
        collecting = self.quiet_gc and _gc_isenabled()
        if collecting:
            _gc_disable()
        self.timing_now = True
        try:
            return self.timing_rounds(rounds, warmup_ms, warmup_rounds, announce)
        finally:
            self.timing_now = False
            if collecting:
                _gc_enable()

    def timing_rounds(self, rounds, warmup_ms, warmup_rounds, announce):
        t_first = _perf_counter_ns()
        self.foreign = None  # the first mark starts the watch (foreign_mark)
        clocked = False  # the clock warm-up ran in this call
        if not self.warmed:
            t_in = _perf_counter_ns()
            inputs = self.make_inputs(self.seed + 6_000_001, 0)
            placed = self.placed(inputs)
            inputs_ms = (_perf_counter_ns() - t_in) / 1e6  # what one call's inputs cost to draw and place
            del placed
            if self.cuda and self.timing_reserve:
                self.reserve_for_rounds(inputs)
            ref_first, cand_first = [], []
            out_bytes = 0
            host_first = []
            if warmup_ms > 0:  # the first calls' times choose the calls per sample: clocks up first
                self.clock_warmup(warmup_ms)
                clocked = True
            for i in _range(3):
                ms, out, nbytes = self.timed_candidate([_clone_inputs(inputs)], -1 - i, f"warm-up call {i}")
                cand_first.append(ms[1])
                host_first.append(self.host_ms)
                out_bytes = _max(out_bytes, nbytes)
                del out
                ms, out = self.timed_reference([_clone_inputs(inputs)], -1 - i)
                ref_first.append(ms[1])
                host_first.append(self.host_ms)
                del out
            in_bytes = _sum(_int(_T_numel(t)) * t.element_size() for t in _tensors_in(inputs))
            # The slower model's median host time per call (the first call of each may be slow).
            host_ms = _max(_sorted(host_first[0::2])[1], _sorted(host_first[1::2])[1])
            self.calls = self.choose_calls(ref_first, cand_first, in_bytes, out_bytes, inputs_ms, host_ms)
            self.laps["timing: first calls' host time per call (ms)"] = host_ms
            self.laps["timing: calls per sample"] = self.calls
            self.laps["timing: first calls' inputs (ms)"] = inputs_ms
            self.prime_inputs = (inputs, _clone_inputs(inputs))
            del inputs
            self.warmed = True
            self.lap("timing: first calls", t_first)
        # Warm-up rounds, untimed, until both models' times have settled, for at most warmup_ms:
        # after idle seconds a GPU's clocks are low, and on an H200 the first ~12 rounds ran up
        # to 30% slower, which decided whole verdicts. While the clocks rise, each round is
        # faster than the ones before; settled means the median of the last three rounds is
        # within _WARMUP_SETTLED of the fastest warm-up round so far, for both models.
        t0 = _perf_counter_ns()
        if warmup_ms > 0 and not clocked:  # not again right after the first calls' warm-up
            self.clock_warmup(warmup_ms)
        n = 0
        ref_seen, cand_seen = [], []
        while n < warmup_rounds or (warmup_ms > 0 and not (_settled(ref_seen) and _settled(cand_seen))
                                    and (_perf_counter_ns() - t0) < warmup_ms * 1e6):
            r_ms, c_ms, _ = self.one_round()
            n += 1
            ref_seen.append(r_ms[1])
            cand_seen.append(c_ms[1])
        self.check_round_fracs()
        self.check_foreign(self.round_no)
        self.lap("timing: warm-up rounds", t0)
        self.laps["timing: warm-up round count"] = self.laps.get("timing: warm-up round count", 0) + n
        if announce:
            self.await_measure()
            self.foreign = None  # waiting for the evaluator's word is not a round
        t0 = _perf_counter_ns()
        self.pair_first = None  # measured rounds start a pair
        ref_ms, cand_ms, ref_stream_ms, cand_stream_ms, first = [], [], [], [], []
        for _ in _range(rounds):
            r_ms, c_ms, cand_goes_first = self.one_round()
            ref_ms.append(_float(r_ms[0]))
            ref_stream_ms.append(_float(r_ms[1]))
            cand_ms.append(_float(c_ms[0]))
            cand_stream_ms.append(_float(c_ms[1]))
            first.append(_bool(cand_goes_first))
        self.check_round_fracs()
        self.check_foreign(self.round_no)
        self.lap("timing: measured rounds", t0)
        if self.floor_ms is None:
            self.measure_floor()
        self.laps["timing: measured round count"] = self.laps.get("timing: measured round count", 0) + rounds
        self.laps["timing: distinct candidate input addresses"] = _len(self.placements)
        return {"ref_ms": ref_ms, "cand_ms": cand_ms, "ref_stream_ms": ref_stream_ms,
                "cand_stream_ms": cand_stream_ms, "cand_first": first, "floor_ms": self.floor_ms, "calls": self.calls,
                "floor_bytes": self.laps.get("timing: floor bytes", 0)}


_WARMUP_SETTLED = 0.03
_ROUND_CHECKS = 4  # calls of a timed sample whose outputs are checked (timed_candidate)
_INPUTS_MS_PER_ROUND = 100.0  # host time a round may spend drawing its calls' inputs (choose_calls)
_DIST3_FACTOR = 32.0  # distribution 3's scale (make_inputs)
_WORKER_METHODS = frozenset(k for k, v in Worker.__dict__.items() if callable(v))


def _settled(times):
    """The median of the last three times is within _WARMUP_SETTLED of the smallest so far."""
    if _len(times) < 3:
        return False
    last = sorted(times[-3:])[1]
    return last <= (1.0 + _WARMUP_SETTLED) * _min(times)


def _cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


_HARNESS_DIR = os.path.dirname(os.path.realpath(__file__))


def _load_harness_module(file, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(_HARNESS_DIR, file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_STATIC_CHECKS_MODULE = _load_harness_module("static_checks.py", "crucible_static_checks")
_CONFINE = _load_harness_module("confine.py", "crucible_confine")


def _confine_worker(scratch, endpoint):
    """Enters the worker's sandbox (confine.py); forks where a PID namespace can be made, and
    only the child returns. Returns what is in force, for the `started` message."""
    socket_path = endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None
    mb = os.environ.get("CRUCIBLE_SCRATCH_MB", "")
    return _CONFINE.enter_worker(scratch, socket_path, _HARNESS_DIR, _int(mb) if mb.isdigit() else 2048)


def _run_worker(args, isolation):
    w = Worker(args)
    w.isolation = isolation
    try:
        w.start()
        w.run()
        raise _Done("runtime_error", (), "the worker ended without a verdict")
    except _Done as d:
        w.chan.done(d.status, d.checks, d.message.replace(w.scratch + os.sep, ""), d.laps)
    except _BaseException as e:  # a harness bug or an unexpected failure: still answer
        if _is_oom(e):  # the harness's own buffers (a round's inputs, copies): named as such
            d = _error_done(e, "in the harness's own buffers (inputs, outputs and copies of the timing rounds)")
            w.chan.done(d.status, d.checks, d.message)
        else:
            w.chan.done("runtime_error", (), "worker error: " + _exc_text(e))
    _os_exit(0)


# ================================================================================================
# Zygote: a process that has imported everything above (torch, zmq, the dynamo patches, the
# static checks) but never touched the device, and forks one fresh worker per request. A fork
# takes tens of milliseconds where starting Python and importing torch takes seconds. Every
# worker is forked from the zygote itself, never from another worker, so nothing one candidate
# did is in the next one's process (docs/evaluator.md, Isolation).
#
# The evaluator (env/sandbox.cpp, zygote) starts it like a worker, sandbox and all, with
# `--zygote` and a Unix socket as its stdin, and sends one JSON object per line:
#   {"type": "fork", "endpoint": "ipc://...", "scratch": DIR, "env": ["K=V", ...]}
#       -> {"type": "forked", "pid": N} or {"type": "error", ...}
#   {"type": "reap", "pid": N}  (once the evaluator has seen N end or has killed it)
#       -> {"type": "reaped", "pid": N, "code": C, "signal": S}
# The zygote reaps a worker only when asked, so a worker's pid cannot be reused while the
# evaluator may still signal its process group.

def _child_setup(req, zygote_pid, report_fd):
    """In a freshly forked worker: the session, environment and descriptors a worker the
    evaluator executes itself gets (env/sandbox.cpp), then the worker's sandbox (confine.py),
    which forks once more: only the worker itself returns, with what is in force."""
    os.setsid()  # own session and process group: kill(-pid) reaches every descendant
    _CONFINE.die_with_parent()  # the zygote
    if os.getppid() != zygote_pid:
        os._exit(1)  # the zygote died between the fork and the prctl
    os.chdir(req["scratch"])
    os.environ.clear()
    for kv in req["env"]:
        k, _, v = kv.partition("=")
        os.environ[k] = v
    _set_harness_env()
    import tempfile
    tempfile.tempdir = None  # recomputed from TMPDIR, the worker's own scratch directory
    # stdin (the zygote's control socket) becomes /dev/null; every other inherited descriptor
    # but the report pipe goes.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.closerange(3, report_fd)
    os.closerange(report_fd + 1, 65536)
    isolation = _confine_worker(req["scratch"], req["endpoint"])
    # Fresh seeds for the global generators, as a new process would have.
    random.seed()
    numpy.random.seed()
    return isolation


def _cuda_touched():
    """Whether this process has initialised CUDA: a fork would then give workers a driver state
    they cannot use. The driver library may be loaded without being initialised (torch's CUDA
    libraries link it): cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED (3) before cuInit,
    and initialises nothing itself."""
    try:
        if torch.cuda.is_initialized():
            return True
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            if not any("/libcuda.so" in line for line in f):
                return False
        lib = ctypes.CDLL("libcuda.so.1", mode=getattr(os, "RTLD_NOLOAD", 4) | getattr(os, "RTLD_LAZY", 1))
        count = ctypes.c_int(0)
        return lib.cuDeviceGetCount(ctypes.byref(count)) != 3
    except OSError:
        return True  # cannot tell: do not fork


def zygote_main(args):
    ctl = 0
    zygote_pid = os.getpid()

    def reply(obj):
        data = (_json_dumps(obj) + "\n").encode("utf-8")
        while data:
            data = data[os.write(ctl, data):]

    # Confined first, while the process has one thread: a CUDA zygote's warm-ups (Triton's) start
    # threads, and a multi-threaded process cannot make a mount namespace (unshare: EINVAL).
    isolation = _CONFINE.enter_zygote()
    _prewarm(args.device == "cuda")
    reply({"type": "ready", "pid": zygote_pid, "isolation": isolation})
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = os.read(ctl, 65536)
            if not chunk:
                _os_exit(0)  # the evaluator closed its end
            buf += chunk
        line, _, buf = buf.partition(b"\n")
        req = _json_loads(line.decode("utf-8"))
        kind = req.get("type")
        if kind == "reap":
            pid = _int(req["pid"])
            try:
                _, status = os.waitpid(pid, 0)
                reply({"type": "reaped", "pid": pid, "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else 0,
                       "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0})
            except ChildProcessError:
                reply({"type": "reaped", "pid": pid, "code": -1, "signal": 0})
            continue
        if kind != "fork":
            reply({"type": "error", "message": f"unknown request {kind!r}"})
            continue
        if _cuda_touched():
            reply({"type": "error", "message": "the zygote has initialised CUDA; it cannot fork workers"})
            continue
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                isolation = _child_setup(req, zygote_pid, w)
                os.write(w, b"+")
                os.close(w)
                _run_worker(argparse.Namespace(endpoint=req["endpoint"], device=args.device, scratch=req["scratch"]),
                            isolation)
            except _BaseException:
                pass
            _os_exit(126)
        os.close(w)
        got = b""
        while True:
            chunk = os.read(r, 16)
            if not chunk:
                break
            got += chunk
        os.close(r)
        if got[:1] != b"+":
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            reply({"type": "error", "message": "the forked worker failed to set itself up"})
            continue
        reply({"type": "forked", "pid": pid})


def main(argv=None):
    p = argparse.ArgumentParser(description="crucible evaluator worker (one candidate, then exit)")
    p.add_argument("--endpoint", default="")
    p.add_argument("--device", choices=("cpu", "cuda"), required=True)
    p.add_argument("--scratch", required=True)
    p.add_argument("--zygote", action="store_true", help="fork workers on request (stdin: control socket)")
    p.add_argument("--kernels", default="", help="fatbin of the harness's own kernels (env/harness/harness_kernels.cu)")
    args = p.parse_args(argv)
    if args.kernels and args.device == "cuda":
        # Read now, before any candidate runs (a zygote's workers inherit the bytes).
        global _KERNELS_IMAGE, _KERNELS_ERROR
        try:
            with open(args.kernels, "rb") as f:
                _KERNELS_IMAGE = f.read()
        except OSError as e:
            _KERNELS_ERROR = f"cannot read the harness kernels {args.kernels}: {e.strerror}"
    if args.zygote:
        zygote_main(args)
        _os_exit(0)
    if not args.endpoint:
        p.error("--endpoint is required")
    _run_worker(args, _confine_worker(args.scratch, args.endpoint))


if __name__ == "__main__":
    main()
