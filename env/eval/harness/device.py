"""env/eval/harness/device.py: what differs between the kinds of device a worker runs on, in one
table (DeviceKind, kind_of: the C++ side's is env/eval/device_kind.hpp), the harness's own CUDA
kernels (harness_kernels.cu's fatbin, which worker.py's main reads at start-up) and the CUDA
driver's IPC calls, loaded when a CUDA worker starts (Worker.start); the reference phase's input
distributions and the input-unchanged check (outputs.py) launch the kernels through _kernels(),
and outputs.py's _encode exports device outputs to the evaluator through _export."""
import collections
import ctypes
import os

import torch

from .trusted import (
    _bytes_hex, _c_byref, _c_cast, _c_char_p, _c_int, _c_int64, _c_size_t, _c_uint64, _c_void_p,
    _cuda_synchronize, _Exception, _ProfilerActivity, _getattr, _int, _int32, _len, _max, _min, _str, _string_buffer, _T_data_ptr,
    _T_item, _T_numel, _T_size, _T_view, _torch_empty, _tuple
)


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
    """The harness's own device operations (env/eval/harness/harness_kernels.cu), from the fatbin the
    build makes, loaded with cuModuleLoadData and launched with cuLaunchKernel on torch's current
    stream: the input-unchanged check (bytes_differ) and the scaling of the input distributions
    (scale_uniform). torch's operations for the same work (equal, the float64 scale, uniform_ and
    mul) load lazily at their first launch in each worker: 156-180 ms in all on an H100, with the
    operations of the timing in one process since removed, against 0.4-0.7 ms for this module
    (docs/performance-history.md, "The harness's own kernels"). Without the fatbin the worker
    uses those torch operations."""

    _FLOAT = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16"}
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
        names = ["crucible_bytes_differ"]
        names += [f"crucible_{k}_{s}" for s in self._FLOAT.values() for k in ("scale_uniform", "scale_signed")]
        for name in names:
            fn = ctypes.c_void_p()
            self._check(lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), f"finding {name}")
            self._fn[name] = fn
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self._blocks = 8 * props.multi_processor_count
        self._stream = torch.cuda.current_stream
        # Small results: [0] unused, [1] the bytes-differ flag (int32), [2] unused.
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

    def bytes_differ(self, a, b):
        """True when two contiguous uint8 tensors of one size differ anywhere (waits for the device)."""
        n = _T_numel(a)
        pa, pb = _T_data_ptr(a), _T_data_ptr(b)
        flag = self._scratch_ptr + 8
        self._zero(flag, 4)
        self._go("crucible_bytes_differ", _max(n // 16, 1), _c_void_p(pa), _c_void_p(pb), _c_int64(n),
                 _c_int(1 if (pa % 16 == 0 and pb % 16 == 0) else 0), _c_void_p(flag))
        return _int(_T_item(_T_view(self._scratch[1:2], _int32)[0])) != 0

    def scale_uniform(self, x, seed, signed=False, out=None):
        """A new tensor like the contiguous floating `x` (or `out`, contiguous, of x's dtype and
        size), each element times U(0.5, 2) drawn from seed, with `signed` also a random sign
        (reference.py, make_inputs, distribution 2)."""
        y = _torch_empty(_tuple(_T_size(x)), dtype=x.dtype, device=x.device) if out is None else out
        n = _T_numel(x)
        kind = "crucible_scale_signed_" if signed else "crucible_scale_uniform_"
        self._go(kind + self._FLOAT[x.dtype], n, _c_void_p(_T_data_ptr(x)),
                 _c_void_p(_T_data_ptr(y)), _c_int64(n), _c_uint64(seed))
        return y


# Loaded when a CUDA worker starts (Worker.start), not at import: a zygote (worker.py,
# zygote_main) imports this module and must not have touched the CUDA driver when it forks workers.
# _KERNELS_IMAGE: the fatbin's bytes, read at start-up (--kernels) before any candidate runs;
# _KERNELS: the module loaded from it, or None (torch operations instead).
_KERNELS_IMAGE = None
_KERNELS_ERROR = ""
_KERNELS = None
_DRIVER_IPC = None
_STREAM_VALUES = None


def _read_kernels_image(path):
    """main's --kernels: the fatbin's bytes, read before any candidate runs (a zygote's workers
    inherit them)."""
    global _KERNELS_IMAGE, _KERNELS_ERROR
    try:
        with open(path, "rb") as f:
            _KERNELS_IMAGE = f.read()
    except OSError as e:
        _KERNELS_ERROR = f"cannot read the harness kernels {path}: {e.strerror}"


def _load_kernels():
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


def _kernels():
    """The harness kernels (_load_kernels), or None: torch operations instead. The other modules
    read them through this function, which they bind at import like every other name: reading
    this module's global through the module object would not be covered by the integrity
    snapshots the same way (a module's class can be replaced, its namespace staying the same)."""
    return _KERNELS


def _load_stream_values():
    """cuStreamWaitValue32 and cuStreamWriteValue32 from the CUDA driver, or None."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fns = []
        for name in ("cuStreamWaitValue32_v2", "cuStreamWriteValue32_v2"):
            fn = _getattr(lib, name)
            fn.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint)
            fn.restype = ctypes.c_int
            fns.append(fn)
        return _tuple(fns)
    except (OSError, AttributeError):
        return None


def _open_driver_ipc():
    """CUDA workers, at start-up (Worker.start): the driver's calls behind _export and the
    device clock's words (_stream_wait_value, _stream_write_value)."""
    global _DRIVER_IPC, _STREAM_VALUES
    _DRIVER_IPC = _load_driver_ipc()
    _STREAM_VALUES = _load_stream_values()


def _stream_value(which, stream, ptr, value):
    if _STREAM_VALUES is None:
        raise RuntimeError("the CUDA driver has no stream memory operations")
    r = _STREAM_VALUES[which](stream, ptr, value, 0)  # wait: >= value; write: with a memory barrier
    if r != 0:
        raise RuntimeError(f"{('cuStreamWaitValue32', 'cuStreamWriteValue32')[which]} failed ({r})")


def _stream_wait_value(stream, ptr, value):
    """Queues on `stream` (a raw CUstream) a wait until the 32-bit word at ptr is >= value."""
    _stream_value(0, stream, ptr, value)


def _stream_write_value(stream, ptr, value):
    """Queues on `stream` the write of value into the 32-bit word at ptr, after a memory barrier."""
    _stream_value(1, stream, ptr, value)


def _export(x):
    """CUDA IPC description of the uint8 device tensor x (kept alive by the caller): the handle of
    the allocation holding it, its offset there and its size. None if the driver refuses."""
    return _export_range(_T_data_ptr(x), _int(_T_numel(x)))


def memory_census():
    """What the device has free and what this process holds there, as one line for an
    out-of-memory message (channel.py, _OOM_CENSUS): torch's own report of who holds the device
    needs NVML, which the sandbox does not reach."""
    free, total = torch.cuda.mem_get_info()
    return (f"the device has {free / 2**30:.1f} GiB free of {total / 2**30:.1f}; this process holds "
            f"{torch.cuda.memory_reserved() / 2**30:.1f} GiB ({torch.cuda.memory_allocated() / 2**30:.1f} GiB in tensors)")


def _export_range(ptr, nbytes):
    """CUDA IPC description of the `nbytes` device bytes at address ptr (kept alive by the
    caller): the handle of the allocation holding them, their offset there and their size. None
    if the driver refuses (memory it did not allocate with cuMemAlloc, or no driver)."""
    if _DRIVER_IPC is None:
        return None
    get_handle, get_range = _DRIVER_IPC
    base, size = _c_uint64(0), _c_size_t(0)
    if get_range(_c_byref(base), _c_byref(size), ptr) != 0:
        return None
    handle = _string_buffer(64)
    if get_handle(handle, base.value) != 0:
        return None
    return {"ipc": _bytes_hex(handle.raw), "offset": ptr - base.value, "bytes": nbytes}


# ------------------------------------------------------------------------------------------------
# The kinds of device.

DeviceKind = collections.namedtuple("DeviceKind", (
    "name", "driver", "device_clock", "synchronize", "exports", "caching_allocator", "memory_info",
    "harness_kernels", "profiler_activities", "device_kernels", "early_snapshots", "quiet_first_profile", "stream_in_flags",
    "graphs", "triton_prewarm", "device_nodes", "other_device_files"))
DeviceKind.__doc__ = """What the harness does differently on one kind of device: a row a kind, read by
every phase that would otherwise ask "is this CUDA?" (a worker's `w.kind`, kind_of(--device)).
A new kind of device adds a row here and the code its fields name; the C++ side's row is in
env/eval/device_kind.hpp (docs/architecture.md, "Adding a kind of device"). A tuple: its fields
cannot be set, and its class is in the integrity snapshot with the harness's other classes.

    name                 the worker's --device and torch's device string
    driver               a driver started at the evaluator's `init` step, its IPC calls opened (worker.py, start)
    device_clock         the reference's profiled call timed by events on the device's stream
                         (reference.py); else by the host's clock
    synchronize          waits for the device's queued work (the worker's sync; nothing on the CPU)
    exports              memory handed to the evaluator by driver handles: the timing's buffers,
                         outputs kept on the device, the trial inputs copied there (executor.py,
                         reference.py, job.py's outputs_on_device)
    caching_allocator    the allocator's free blocks poisoned between phases (reference.py, poison_free_pool)
                         and given back to the device before the timing's buffers (executor.py, make_buffers)
    memory_info          the device's free and total memory bound the trials' and timing's budgets
                         (reference.py, executor.py)
    harness_kernels      the harness's own kernels may be loaded (worker.py; reference.py, executor.py)
    profiler_activities  what the profiler records of a call (reference.py, profiled)
    device_kernels       the profiler sees the device's kernels and launches: the reference's
                         kernel_mode is "device" or "launches" by them (reference.py)
    early_snapshots      the integrity snapshots made while waiting for the job (on the CPU that
                         would compete with a neighbour's timed rounds for the cores)
    quiet_first_profile  the profiler's first use runs with fd 2 on /dev/null (without a GPU it logs
                         "gpuGetDeviceCount failed" to the user's terminal)
    stream_in_flags      the current stream is one of the process-wide settings checked after a call
    graphs               the cuda-graph baseline can run (job.py)
    triton_prewarm       Triton's hooks installed in the zygote before it forks (builds.py, _prewarm)
    device_nodes         the worker may open every device file under /dev (its driver opens several);
                         without it only /dev/null, /dev/zero, /dev/full, /dev/random and /dev/urandom
                         (Landlock, confine.py): on most hosts a GPU's nodes are open to every user,
                         and a CPU worker that reached one could compute on the GPU while its samples
                         are charged only the CPU time of its processes
    other_device_files   the device files of the host's other devices, which the worker gives up
                         once its own device's context exists and before any candidate code loads
                         (confine.py, narrow_devices: a second Landlock layer its child processes
                         keep; evaluator.cuda_own_device_only): no process of the candidate's
                         computes on a second GPU inside its sample's window
"""


def _no_device_work():
    """A CPU worker's synchronize: nothing is queued anywhere."""


def other_gpu_files(bus, gpus="/proc/driver/nvidia/gpus", dev="/dev"):
    """The device files of the GPUs other than the one at PCI address `bus` ("0000:18:00.0"):
    every /dev/nvidiaN but the one whose N is that GPU's minor, which the driver's file
    GPUS/BUS/information names ("Device Minor: N"). RuntimeError naming the file where it cannot
    be read."""
    info = os.path.join(gpus, bus, "information")
    try:
        with open(info, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise RuntimeError(f"{info}: {e.strerror}: the GPU's device file is not known (a host without "
                           "/proc/driver/nvidia runs with evaluator.cuda_own_device_only: false)") from None
    own = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Device Minor" and value.strip().isdigit():
            own = int(value)
    if own is None:
        raise RuntimeError(f"{info}: no \"Device Minor\" line: the GPU's device file is not known")
    return sorted(os.path.join(dev, n) for n in os.listdir(dev)
                  if n.startswith("nvidia") and n[6:].isdigit() and int(n[6:]) != own)


def _cuda_other_device_files():
    """other_gpu_files of the GPU this worker's context runs on (its PCI address from torch)."""
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return other_gpu_files(f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0")


CPU = DeviceKind(name="cpu", driver=False, device_clock=False, synchronize=_no_device_work, exports=False,
                 caching_allocator=False, memory_info=False, harness_kernels=False,
                 profiler_activities=(_ProfilerActivity.CPU,), device_kernels=False, early_snapshots=False, quiet_first_profile=True,
                 stream_in_flags=False, graphs=False, triton_prewarm=False, device_nodes=False,
                 other_device_files=None)
CUDA = DeviceKind(name="cuda", driver=True, device_clock=True, synchronize=_cuda_synchronize, exports=True,
                  caching_allocator=True, memory_info=True, harness_kernels=True,
                  profiler_activities=(_ProfilerActivity.CPU, _ProfilerActivity.CUDA), device_kernels=True,
                  early_snapshots=True,
                  quiet_first_profile=False, stream_in_flags=True, graphs=True, triton_prewarm=True, device_nodes=True,
                  other_device_files=_cuda_other_device_files)
KINDS = {k.name: k for k in (CPU, CUDA)}


def kind_of(device):
    """The row of a worker's --device ("cpu" or "cuda"); ValueError naming it for any other."""
    k = KINDS.get(device)
    if k is None:
        raise ValueError(f"unknown device kind {device!r}: the harness knows {', '.join(sorted(KINDS))}")
    return k
