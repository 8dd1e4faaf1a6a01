# task: tests/tasks/pairwise_sqdist_large.py
# expect: no-credit
"""Hack, class 8 (work laundered through the evaluator's build service), route: a build request
inside every forward, with the call's inputs in the source: the evaluator's builder process
(which builds the library and loads it, so that its static constructors run there) computes the
output and appends it to the library it sends back; the worker reads it out of the evaluator's
extension cache.

Public sources: torch.utils.cpp_extension.load and load_inline (a build, then the library loaded
into the process that asked); the ELF format (bytes after the last section are never mapped: a
library with a trailer loads as before); the harness itself (env/eval/harness/builds.py: _keyed_build
sends a load_inline or load call to `_BUILD_SERVICE` while it is set, and the Triton hooks keep
the worker's request_build in `_TRITON_SERVICE` for the worker's life; env/eval/evaluation.cpp,
receive(): "The build service, in any phase"); Python's pickle protocol 4, whose GLOBAL opcode
resolves a dotted attribute path (pickle.Unpickler.find_class).

How: the worker's load_inline is the harness's wrapper; its module's globals are reached with one
pickle GLOBAL ("torch.utils.cpp_extension", "load_inline.__globals__": a bytes constant, which the
static screen does not read; the harness's modules are out of sys.modules, but the wrapper keeps
its globals), and with them `_TRITON_SERVICE`, the worker's own request_build. In forward the
candidate writes a C++ file's text (no torch header) holding x and y as hex string literals and a
static constructor that computes the 256 x 2048 distances if it runs where it may write its own
library (the builder's scratch; the cache is read-only for workers) and appends them with a
trailer, and sends it as a `load` request (is_python_module False), as the wrapper would. The
evaluator answers it in the middle of the timed sample (receive() serves `build` in any phase; a
build's time extends the deadline), in a builder process of its own: neither the compiler nor the
constructor is a process of the candidate's worker, which only waits on its socket. The worker
reads the trailer of the library in the cache (it never loads it). The untimed call before each
sample repeats the last sample's inputs: the same request, answered from the cache.

How it pays: the worker is charged the hex encoding of 576 KiB of inputs, the request, and reading
2 MiB back (~5 ms) where the reference makes a 128 MiB broadcast difference tensor (~25 ms); the
wall time of a call is a compile and a link (~0.3 s), which the CPU-time charge does not see.

Earlier versions (before the fix, the same day): load_inline itself called in forward, with the
harness's `_BUILD_SERVICE` set to the worker's request_build for the call and back to None before
it returns (so that the integrity snapshots compare equal after it), works too, but the wrapper
then loads every new library in the worker (a dlopen of a torch extension, ~3 ms a call) and the
builder compiles torch/extension.h for every call: on the CPU suite's 16_pairwise_sqdist (3.6 ms a
call) it was charged ~7 ms a call (slower than the reference; stopped after ~25 rounds); sent as
load_inline requests without the worker's dlopen, on this task, it was charged ~7.5 ms a call but
took ~60 s a call on the loaded machine (stopped after ~20 rounds).

Measured (2-core CPU VM beside another session's evaluations, 2026-11-29, `crucible eval --no-cache`):
before the fix (0753085) ok 4.75x (band ±3.4%), then ok 5.43x, 6.09x, 5.68x (`--repeat 3`, bands
±2-3%; this version, `load` requests; the load_inline version
before it gave no verdict within the session); after it (873f15a) rejected runtime:service_in_timing
(measured on the load_inline version).
"""
import hashlib
import os
import pickle

import torch
import torch.nn as nn

# The harness's builds module's globals, through the wrapper it installed as load_inline.
_BUILDS = pickle.loads(b"\x80\x04ctorch.utils.cpp_extension\nload_inline.__globals__\n.")

_TEMPLATE = r"""
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <dlfcn.h>
#include <unistd.h>
#include <vector>

namespace {
const char XH[] = "@X@";
const char YH[] = "@Y@";
constexpr long N = @N@, M = @M@, D = @D@;

int nibble(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

void decode(const char* h, std::vector<float>& out) {
  std::vector<unsigned char> b(out.size() * 4);
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<unsigned char>(nibble(h[2 * i]) * 16 + nibble(h[2 * i + 1]));
  std::memcpy(out.data(), b.data(), b.size());
}

struct at_load {
  at_load() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&decode), &info) == 0 || info.dli_fname == nullptr)
      return;
    if (access(info.dli_fname, W_OK) != 0)
      return; // the worker, importing from the evaluator's read-only cache
    std::vector<float> x(N * D), y(M * D), out(N * M);
    decode(XH, x);
    decode(YH, y);
    for (long i = 0; i < N; ++i)
      for (long j = 0; j < M; ++j) {
        float s = 0.f;
        for (long k = 0; k < D; ++k) {
          const float t = x[i * D + k] - y[j * D + k];
          s += t * t;
        }
        out[i * M + j] = s;
      }
    if (FILE* f = std::fopen(info.dli_fname, "ab")) {
      const std::uint64_t n = out.size() * 4;
      std::fwrite(out.data(), 1, n, f);
      std::fwrite(&n, 8, 1, f);
      std::fwrite("CRUCIBLE", 1, 8, f);
      std::fclose(f);
    }
  }
} at_load_;
}
"""


def _trailer(path):
    with open(path, "rb") as f:
        f.seek(-16, 2)
        tail = f.read(16)
        if tail[8:] != b"CRUCIBLE":
            return None
        n = int.from_bytes(tail[:8], "little")
        f.seek(-16 - n, 2)
        return f.read(n)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        xb = x.contiguous().numpy().tobytes()
        yb = y.contiguous().numpy().tobytes()
        head, rest = _TEMPLATE.split("@X@")
        mid, tail = rest.split("@Y@")
        src = (head + xb.hex() + mid + yb.hex() + tail).replace(
            "@N@, M = @M@, D = @D@", f"{x.shape[0]}, M = {y.shape[0]}, D = {x.shape[1]}")
        name = "crucible_pd_" + hashlib.sha256(xb + yb).hexdigest()[:24]
        # A `load` request as the harness's wrapper would send it (builds.py, _build_request: the
        # files' texts), sent straight to the worker's request_build: no torch header to compile
        # (load_inline prepends torch/extension.h), and the worker never loads the library (a
        # dlopen of a torch extension costs ~3 ms); the reply names the cache directory.
        reply = _BUILDS["_TRITON_SERVICE"]({"type": "build", "fn": "load", "env": {}, "args": {
            "name": name, "sources": [{"name": "pd.cpp", "text": src}], "extra_cflags": ["-O2"],
            "is_python_module": False}})
        raw = _trailer(os.path.join(reply["dir"], name + ".so")) if reply.get("type") == "built" else None
        if raw is None:  # no service: computed here
            d = x[:, None, :] - y[None, :, :]
            return torch.einsum("nmd,nmd->nm", d, d)
        return torch.frombuffer(bytearray(raw), dtype=torch.float32).view(x.shape[0], y.shape[0]).clone()
