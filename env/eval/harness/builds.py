"""env/eval/harness/builds.py: the build services of a worker: torch.utils.cpp_extension's load_inline
and load, and Triton's compiles, sent to the evaluator's build service (a sandboxed builder
process, env/eval/evaluator.cpp) while candidate code runs, and the builder's side of that service
(build_extension, build_triton); also the warm-ups a zygote makes before it forks (_prewarm).

Loaded with the harness package (worker.py, before any candidate code); the state it keeps, which
service the builds go to, is set through _use_build_service and _use_triton_service."""
import base64
import fcntl
import functools
import hashlib
import inspect
import json
import logging
import os
import sys

import torch


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


# The evaluator's build service, set while the candidate's module executes (trials.py, load_phase):
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
    module executes or its ModelNew is constructed, a call is built by the evaluator in a
    sandboxed builder process and kept in the evaluator's extension cache, keyed by the whole
    request (sources, functions, flags, name, build environment); this worker only imports the
    result, read-only. No worker can write what another candidate will load. A build_directory
    of the call's own is not used (the library is the same wherever it is built). Calls the
    request cannot carry (_build_request), or made at other times, build here, in the worker's
    own scratch directory."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def build(*args, **kwargs):
        service = _BUILD_SERVICE
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            return fn(*args, **kwargs)  # torch reports the bad call itself
        if service is None:
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
    pch = req.get("pch")
    if isinstance(pch, str) and pch:
        # torch/extension.h precompiled by the evaluator for exactly these flags (its build
        # service's pch/ directory): first on the include path, GCC takes torch/extension.h.gch
        # from there, or, where it cannot use it, the torch/extension.h beside it, which includes
        # torch's own.
        args["extra_include_paths"] = [pch] + list(args.get("extra_include_paths") or [])
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


def _use_build_service(service):
    """Sends load_inline and load calls to `service` (trials.py's load_phase, while the candidate's
    module executes), or builds them here (None)."""
    global _BUILD_SERVICE
    _BUILD_SERVICE = service


def _use_triton_service(service, scratch):
    """Sends Triton's builds to `service` (Worker.__init__, for the worker's life), or builds them
    here (None: a builder, Worker.await_step); `scratch` is the worker's scratch directory."""
    global _TRITON_SERVICE, _TRITON_SCRATCH
    _TRITON_SERVICE = service
    _TRITON_SCRATCH = scratch


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
    candidate's first call (docs/performance-history.md, "Cheaper rounds"). Done in the zygote, before any
    fork, it is paid once per evaluator; it touches no CUDA driver. CUDA workers only. Also
    puts Triton's builds on the evaluator's build service (_install_triton_hooks)."""
    try:
        from triton.runtime.cache import triton_key
        triton_key()
        import triton.experimental.gluon  # noqa: F401
        _install_triton_hooks()
    except Exception:  # no Triton, or another version: its first launch pays as before
        pass


def _prewarm(kind):
    """The zygote's warm-ups, before it forks (a worker started as its own interpreter makes
    them before it says `started`; in a forked one they are already done); `kind`: device.py's
    DeviceKind."""
    _prewarm_cpp_extension()
    if kind.triton_prewarm:
        _prewarm_triton()
