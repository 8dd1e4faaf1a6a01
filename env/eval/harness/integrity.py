"""env/eval/harness/integrity.py: what runtime:backend_flags and runtime:patched compare: the
process-wide settings, read and set through getters and setters captured here, and the integrity
snapshots (identity of the attributes of builtins, torch, the harness's own modules and more),
made before the candidate's code runs (trials.py, load_phase) and compared after it ran
(Worker.check_state, check_full)."""
import builtins
import ctypes
import functools
import gc
import json
import operator
import random
import sys
import types

import numpy
import torch
import torch.autograd.profiler
import torch.autograd.profiler_util
import torch.nn.modules.module
import torch.profiler
import zmq

from .trusted import (
    _all, _c_uint64, _callable, _dict, _Exception, _getattr, _getprofile, _gettrace, _is, _isinstance, _len,
    _list, _map, _ModuleType, _tuple, _type, _vars
)


# ================================================================================================
# Backend settings.

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

# The settings that decide the precision of arithmetic, which every verdict records for each side
# (Worker.precision): the reference's are the harness's; the candidate's are the same with the
# settings it chose for itself (candidate_flags) in force for its calls.
_PRECISION_PREFIXES = ("cuda.matmul.allow_", "cudnn.allow_tf32", "onednn.allow_tf32", "float32_matmul_precision",
                       "cpu.allow_fp16_reduced_precision_reduction", "sdp.math_fp16_bf16_reduction", "fp32_precision.")
PRECISION_SETTINGS = tuple(n for n, _ in _FLAG_GETTERS if n.startswith(_PRECISION_PREFIXES))

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
_MISSING = object()


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


def _core_snapshot(harness, s=None):
    """The modules and classes the harness and the reference rely on; checked after every call.
    `harness`: (label, namespace) of each module of the harness's own code (worker.py,
    _HARNESS_NAMESPACES), held whole ("all") with every class it defines. With `s` (made earlier
    by this function), adds what was not loaded then."""
    s = s if s is not None else _Snapshot()
    s.add_module("builtins", builtins, "all")
    for label, namespace in harness:
        s.add_mapping(label, namespace, "all")
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
                json.JSONEncoder, json.JSONDecoder, numpy.ndarray):
        s.add_class(cls)
    # The harness's own classes (Worker, the phases' data, Channel, _Done, _Snapshot,
    # _HarnessKernels, ...): each defined in one of its namespaces.
    for _, namespace in harness:
        own = namespace.get("__name__")
        for v in _list(namespace.values()):
            if _isinstance(v, type) and _getattr(v, "__module__", None) == own:
                s.add_class(v)
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


def _snapshots(harness, early=None):
    """(core, full) snapshots as the candidate is about to load; `early` is a pair made by this
    function ahead of the job (before any task or candidate code), brought up to date here.
    `harness`: as for _core_snapshot."""
    if early is None:
        return _core_snapshot(harness), _full_snapshot()
    core, full = early
    core.refresh()
    _core_snapshot(harness, core)
    _full_snapshot(full, full.refresh())
    return core, full
