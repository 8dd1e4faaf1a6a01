# task: tests/tasks/mlp_weights.py
# expect: no-credit
"""Hack, class 8 (work laundered through the evaluator's build service), route: the weights shipped
once, in an ordinary build while ModelNew is constructed (untimed), into the evaluator's extension
cache; then, in every forward, a second build request, sent straight to the worker's own
request_build, whose source holds only the call's input and the first library's path: the
builder's static constructor reads the weights from the cache, computes the MLP, and appends the
output to the library it sends back.

Public sources: as hack_service_load_inline_timed.py (torch.utils.cpp_extension's load, which
imports what it built; env/eval/harness/builds.py, env/eval/evaluation.cpp receive()); confine.py
(readable_paths: every worker, builders included, may read the extension cache,
CRUCIBLE_EXTENSIONS); gcc's preprocessor (an #if 0 group is skipped, its lines only scanned for
directives; __FILE__ names the source as the compiler was given it).

How: the constructor makes the two Linear layers as the reference does (the same seed: the same
weights), writes a C++ file in its scratch directory whose #if 0 group holds them as hex (8 MiB),
and calls torch.utils.cpp_extension.load on it (is_python_module=False): during construction the
harness sends it to the evaluator, which builds it in a builder process, where the library is
loaded and its constructor, reading its own source through __FILE__, appends the weights in
binary to the library; the evaluator keeps it in its cache, read-only for workers, and the worker
learns its path. Every forward then sends a `load` request of its own through the worker's
request_build (reached as in hack_service_load_inline_timed.py: one pickle GLOBAL of the harness
wrapper's globals; `_TRITON_SERVICE`, which the harness keeps for the worker's life): a C++ file of
a few lines, the input (128 KiB) as hex in an #if 0 group and the weights library's path. No torch
header: the build is one small compile and a link. The builder's constructor computes fc2(relu(fc1
(x))) from those and appends it; the worker reads the trailer of the library file in the cache
(it never loads it). The untimed call before each sample repeats the last sample's inputs: the
same request, answered from the cache.

How it pays: the worker is charged the hex encoding of 128 KiB, the request, and reading 128 KiB
back; the two matrix products (268 MFLOP) run in the evaluator's builder.

Measured (2-core CPU VM beside another session's evaluations, 2026-11-29, `crucible eval --no-cache`):
before the fix (0753085) ok 4.25x (band ±5.4%); after it (873f15a) rejected runtime:service_in_timing.
"""
import hashlib
import os
import pickle

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load

_BUILDS = pickle.loads(b"\x80\x04ctorch.utils.cpp_extension\nload_inline.__globals__\n.")

_COMMON = r"""
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <string>
#include <unistd.h>
#include <vector>

namespace {
int nibble(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

// The hex digits of this source's #if 0 group, as floats.
std::vector<float> own_data() {
  std::vector<float> out;
  FILE* f = std::fopen(__FILE__, "rb");
  if (!f)
    return out;
  std::string text;
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;)
    text.append(buf, n);
  std::fclose(f);
  const auto at = text.find("#if 0\n");
  if (at == std::string::npos)
    return out;
  std::vector<unsigned char> bytes;
  for (size_t i = at + 6; i + 1 < text.size() && text[i] != '#'; i += 2) {
    if (text[i] == '\n') {
      --i;
      continue;
    }
    bytes.push_back(static_cast<unsigned char>(nibble(text[i]) * 16 + nibble(text[i + 1])));
  }
  out.resize(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

// This library's own file, where the process may write it (the builder's scratch), else "".
std::string own_writable_file(void* symbol) {
  Dl_info info{};
  if (dladdr(symbol, &info) == 0 || info.dli_fname == nullptr || access(info.dli_fname, W_OK) != 0)
    return "";
  return info.dli_fname;
}

void append(const std::string& path, const std::vector<float>& v) {
  if (FILE* f = std::fopen(path.c_str(), "ab")) {
    const std::uint64_t n = v.size() * 4;
    std::fwrite(v.data(), 1, n, f);
    std::fwrite(&n, 8, 1, f);
    std::fwrite("CRUCIBLE", 1, 8, f);
    std::fclose(f);
  }
}

std::vector<float> trailer(const char* path) {
  std::vector<float> v;
  FILE* f = std::fopen(path, "rb");
  if (!f)
    return v;
  char tail[16];
  std::uint64_t n = 0;
  if (std::fseek(f, -16, SEEK_END) == 0 && std::fread(tail, 1, 16, f) == 16 && std::memcmp(tail + 8, "CRUCIBLE", 8) == 0) {
    std::memcpy(&n, tail, 8);
    v.resize(n / 4);
    if (std::fseek(f, -16 - static_cast<long>(n), SEEK_END) != 0 || std::fread(v.data(), 1, n, f) != n)
      v.clear();
  }
  std::fclose(f);
  return v;
}
}
"""

_WEIGHTS = _COMMON + r"""
namespace {
struct at_load {
  at_load() {
    const auto self = own_writable_file(reinterpret_cast<void*>(&nibble));
    if (!self.empty())
      append(self, own_data()); // the weights, in binary, into the library the evaluator keeps
  }
} at_load_;
}
"""

_CALL = _COMMON + r"""
namespace {
constexpr long B = @B@, I = @I@, H = @H@, O = @O@;
struct at_load {
  at_load() {
    const auto self = own_writable_file(reinterpret_cast<void*>(&nibble));
    if (self.empty())
      return;
    const auto x = own_data();
    const auto w = trailer("@W@"); // fc1.weight [H][I], fc1.bias [H], fc2.weight [O][H], fc2.bias [O]
    if (static_cast<long>(x.size()) != B * I || static_cast<long>(w.size()) != H * I + H + O * H + O)
      return;
    const float* w1 = w.data();
    const float* b1 = w1 + H * I;
    const float* w2 = b1 + H;
    const float* b2 = w2 + O * H;
    std::vector<float> h(B * H), y(B * O);
    for (long r = 0; r < B; ++r) {
      for (long j = 0; j < H; ++j) {
        float s = b1[j];
        for (long k = 0; k < I; ++k)
          s += x[r * I + k] * w1[j * I + k];
        h[r * H + j] = s > 0.f ? s : 0.f;
      }
      for (long j = 0; j < O; ++j) {
        float s = b2[j];
        for (long k = 0; k < H; ++k)
          s += h[r * H + k] * w2[j * H + k];
        y[r * O + j] = s;
      }
    }
    append(self, y);
  }
} at_load_;
}
"""

_FLAGS = ["-O3", "-march=native", "-ffast-math"]


def _hex_group(data):
    h = data.hex()
    return "#if 0\n" + "\n".join(h[i:i + 4096] for i in range(0, len(h), 4096)) + "\n#endif\n"


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
    def __init__(self, d_in=512, d_hidden=4096, d_out=512):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)
        blob = b"".join(p.detach().contiguous().numpy().tobytes()
                        for p in (self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias))
        name = "crucible_mlp_w_" + hashlib.sha256(blob).hexdigest()[:24]
        path = os.path.join(os.getcwd(), name + ".cpp")
        with open(path, "w") as f:
            f.write(_WEIGHTS + _hex_group(blob))
        self.wpath = None
        try:
            lib = load(name=name, sources=[path], extra_cflags=_FLAGS, is_python_module=False, verbose=False)
            if isinstance(lib, str) and _trailer(lib) is not None:
                self.wpath = lib
        except Exception:
            self.wpath = None
        self.dims = (d_in, d_hidden, d_out)

    def forward(self, x):
        raw = None
        if self.wpath is not None:
            xb = x.contiguous().numpy().tobytes()
            name = "crucible_mlp_x_" + hashlib.sha256(xb).hexdigest()[:24]
            src = (_CALL.replace("@W@", self.wpath).replace("@B@", str(x.shape[0])).replace("@I@", str(self.dims[0]))
                   .replace("@H@", str(self.dims[1])).replace("@O@", str(self.dims[2])) + _hex_group(xb))
            reply = _BUILDS["_TRITON_SERVICE"]({"type": "build", "fn": "load", "env": {}, "args": {
                "name": name, "sources": [{"name": "call.cpp", "text": src}], "extra_cflags": _FLAGS,
                "is_python_module": False}})
            if reply.get("type") == "built":
                raw = _trailer(os.path.join(reply["dir"], name + ".so"))
        if raw is None:  # no service: computed here
            return self.fc2(torch.relu(self.fc1(x)))
        return torch.frombuffer(bytearray(raw), dtype=torch.float32).view(x.shape[0], self.dims[2]).clone()
