"""env/eval/harness/channel.py: the worker's end of the protocol with the evaluator
(docs/evaluator-protocol.md): the ZeroMQ PAIR socket the messages travel on (Channel), and the
outcomes that end a job with a `done` message (_Done, _error_done), whose messages carry the
candidate's tracebacks without the harness's own frames."""
import os

import zmq

from .trusted import (
    _BaseException, _format_exception, _format_exception_only, _isinstance, _json_dumps, _json_loads, _len,
    _LINGER, _list, _MemoryError, _NOBLOCK, _os_exit, _os_getppid, _OutOfMemoryError, _range, _RCVMORE,
    _RCVTIMEO, _repr, _round, _SNDMORE, _SNDTIMEO, _StackSummary, _str, _TracebackException, _type, _z_close,
    _z_get, _z_recv, _z_send, _z_set, _ZAgain, _ZMQError
)


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


def _build_log(text, lines=60, chars=4000, errors=20):
    """A failed build's log for the evaluator and the candidate: the compiler's error lines
    first, then the tail. The tail alone can miss them: a build of several files (C++ and CUDA)
    prints, after the file that failed, the command lines of the files still compiling, each
    thousands of characters long."""
    ls = text.rstrip().splitlines()
    errs = []
    for line in ls:
        low = line.lower()
        if len(line) <= 1000 and ("error:" in low or "error " in low or " error" in low) and \
                not line.startswith(("[", "FAILED:")):
            errs.append(line[:300])
            if len(errs) >= errors:
                break
    tail = _tail(text, lines, chars)
    if not errs or all(e in tail for e in errs):
        return tail
    head = "\n".join(errs)
    return (head + "\n...\n" + tail[-max(chars - len(head), 1000):])[-2 * chars:]


# The harness's own files (worker.py and the modules beside it) are this folder's.
_HARNESS_DIR = os.path.dirname(os.path.realpath(__file__))
_MODULE_PY = os.path.join("torch", "nn", "modules", "module.py")


def _harness_frame(filename):
    return filename.endswith(_MODULE_PY) or os.path.dirname(os.path.realpath(filename)) == _HARNESS_DIR


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


# Set by the worker where its device reports its memory (device.py, memory_info): a line saying
# how much of the device is free and how much this process holds, for an out-of-memory message.
_OOM_CENSUS = [None]


def _oom_census():
    f = _OOM_CENSUS[0]
    if f is None:
        return ""
    try:
        return f"; {f()}"
    except _BaseException:
        return ""


def _error_done(e, where):
    if _isinstance(e, _Done):
        return e
    if _is_oom(e):
        return _Done("runtime_error", (), f"out of memory {where}: {_exc_line(e)}{_oom_census()}")
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
        """The next message's header (frames come only with recv_frames' messages)."""
        return self.recv_frames()[0]

    def recv_frames(self):
        """The next message with its binary frames: (header, [bytes, ...])."""
        while True:
            try:
                first = _z_recv(self.sock, 0)
            except _ZAgain:
                if _os_getppid() != self.parent:
                    _os_exit(1)  # the evaluator died
                continue
            frames = []
            while _z_get(self.sock, _RCVMORE):
                frames.append(_z_recv(self.sock, 0))
            return _json_loads(first.decode("utf-8")), frames

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


def _need(msg, key):
    """A field the evaluator's message must carry: the C++ side owns every value
    (env/eval/worker_messages.cpp), and a message without it ends the job naming it."""
    if key not in msg:
        raise _Done("runtime_error", (), f"the evaluator's {msg.get('type')!r} message lacks {key!r}")
    return msg[key]
