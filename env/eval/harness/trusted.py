"""env/eval/harness/trusted.py: the functions and constants the harness uses once candidate code may
have run, captured here when worker.py loads this module, before any candidate code exists; the
other modules of the harness import them from here.

Trust model (worker.py's docstring): the C-level functions where torch has them (e.g.
torch._C._cuda_synchronize rather than torch.cuda.synchronize), bound to names of this module and
of each module that imports them; every one of those namespaces is in the integrity snapshots
(integrity.py, _core_snapshot), so a candidate that rebinds one is caught (runtime:patched)."""
import ctypes
import gc
import inspect
import json
import math
import operator
import os
import random
import sys
import threading
import time
import traceback
import types

import numpy
import torch
import torch.autograd
import torch.profiler
import zmq

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
_strict_dumps = json.JSONEncoder(allow_nan=False).encode
_isfinite = math.isfinite


def _finite(obj):
    """`obj` with every float that is not finite (NaN, an infinity) as None: the evaluator reads
    strict JSON (env/eval/wire.hpp), where such a value is read as missing."""
    if _isinstance(obj, _float):
        return obj if _isfinite(obj) else None
    if _isinstance(obj, _dict):
        return {k: _finite(v) for k, v in obj.items()}
    if _isinstance(obj, (_list, _tuple)):
        return [_finite(v) for v in obj]
    return obj


def _json_dumps(obj):
    """A message as strict JSON (no NaN or Infinity tokens, which the evaluator's parser refuses)."""
    try:
        return _strict_dumps(obj)
    except ValueError:
        return _strict_dumps(_finite(obj))


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

_Tensor = torch.Tensor
_T_detach = torch.Tensor.detach
_T_cpu = torch.Tensor.cpu
_T_contiguous = torch.Tensor.contiguous
_T_reshape = torch.Tensor.reshape
_T_view = torch.Tensor.view
_T_numpy = torch.Tensor.numpy
_T_clone = torch.Tensor.clone
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
_T_mul_ = torch.Tensor.mul_
_T_index_put_ = torch.Tensor.index_put_
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
_torch_isclose = torch.isclose
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
_cuda_mem_get_info = torch.cuda.mem_get_info

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

_c_uint64 = ctypes.c_uint64
_c_int64 = ctypes.c_int64
_c_int = ctypes.c_int
_c_void_p = ctypes.c_void_p
_c_char_p = ctypes.c_char_p
_c_cast = ctypes.cast
_c_size_t = ctypes.c_size_t
_c_byref = ctypes.byref
_string_buffer = ctypes.create_string_buffer
_bytes_hex = bytes.hex
