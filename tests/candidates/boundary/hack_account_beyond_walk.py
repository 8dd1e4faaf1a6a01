# task: env/tasks/cpu/14_tril_matmul.py
# expect: no-credit
"""Hack, class 7 (CPU time the accounting never sees), route: a computing process placed where the
accounting's walk of the worker's processes does not reach: after 4,096 others.

Public sources: env/eval/sandbox.cpp (worker::cpu_ns and signal_tree walk the processes below the
worker's PID 1 breadth-first, "k < 4096"); docs/evaluator.md, Trust boundary, Not covered yet ("The
stop reaches at most 4096 processes below the worker's PID 1"); proc(5) (/proc/PID/task/TID/children
lists a thread's children in the order they were made).

How: while the module loads (untimed) it makes 4,200 children with clone(CLONE_VM | SIGCHLD)
(glibc's wrapper, the worker's memory shared) that end at once; the worker's Python never waits for
them, so they stay zombies, which cost nothing, are never woken by a stop or a continuation, and
still sit in the kernel's list of the worker's children. Then it makes one computing process the
same way. The walk takes the worker's PID 1 first and then its children in the order the kernel
lists them (creation order): the zombies fill the walk's 4,096 places and the computing process is
never read, in either of a sample's readings. It is still stopped and continued with the worker's
process group (the SIGSTOP to the group reaches it: it made no group of its own), so it runs only
inside the candidate's calls. Each forward hands it the job through shared memory (a futex word
each way) and sleeps until it is done: the worker's thread is charged the hand-over, the process
that computed (tril(A @ B), a plain C++ loop) is charged nothing.

How it pays: a call is charged under a millisecond whatever the computing process ran (~8 ms); the
same loop honestly charged is 0.89x. The evaluator pays for the walk instead: 4,200 processes read
at every stop, continuation and reading (a verdict took 150 s instead of 30). The first version
used 4,200 sleeping processes instead of zombies: each was woken by every stop and continuation,
and their wake-ups, within the walk, were charged (0.14x).

Measured (2-core CPU VM beside another session's evaluations, 2026-11-29, `crucible eval --no-cache`):
before the fix (0753085) this version (zombies) ok 10.96x (band ±4.2%), then ok 12.10x, 10.36x,
11.03x (`--repeat 3`, bands ±6%, ±10%, ±7%); the first version (sleeping processes) 0.13x; after it (873f15a) ok 0.82x (no credit).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <atomic>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {
struct job_t {
  std::atomic<int> go{0};
  std::atomic<int> done{0};
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
  long m = 0, k = 0, n = 0;
};
job_t* job = nullptr;

// tril(A @ B), A [m][k], B [k][n]: each row's lower part accumulated over k, its upper part zero.
void rows(const float* a_, const float* b_, float* c_, long m, long k, long n) {
  for (long i = 0; i < m; ++i) {
    float* c = c_ + i * n;
    for (long j = 0; j < n; ++j)
      c[j] = 0.f;
    const float* a = a_ + i * k;
    const long lower = i + 1 < n ? i + 1 : n;
    for (long p = 0; p < k; ++p) {
      const float s = a[p];
      const float* b = b_ + p * n;
      for (long j = 0; j < lower; ++j)
        c[j] += s * b[j];
    }
  }
}

void wait_word(std::atomic<int>& w, int while_is) {
  while (w.load(std::memory_order_acquire) == while_is)
    syscall(SYS_futex, reinterpret_cast<int*>(&w), FUTEX_WAIT, while_is, nullptr, nullptr, 0);
}

void wake_word(std::atomic<int>& w, int value) {
  w.store(value, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<int*>(&w), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

int placeholder(void*) {
  return 0; // ends at once; the worker never waits for it: a zombie, which costs no CPU time
}

int computer(void*) {
  for (;;) {
    wait_word(job->go, 0);
    job->go.store(0, std::memory_order_relaxed);
    rows(job->a, job->b, job->c, job->m, job->k, job->n);
    wake_word(job->done, 1);
  }
  return 0;
}
}

// Made while the module loads: `placeholders` children that end at once and stay zombies (the
// worker's Python never reaps them), then the computing one. Returns how many were made.
long start(long placeholders) {
  constexpr size_t small = 64 << 10, big = 1 << 20;
  void* s = mmap(nullptr, small + big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (s == MAP_FAILED)
    return 0;
  char* stacks = static_cast<char*>(s);
  job = new job_t();
  long made = 0;
  for (long k = 0; k < placeholders; ++k) {
    const pid_t pid = clone(placeholder, stacks + small, CLONE_VM | SIGCHLD, nullptr);
    if (pid <= 0)
      break;
    siginfo_t info{};
    waitid(P_PID, pid, &info, WEXITED | WNOWAIT); // it has ended (and stays a zombie): its stack is free again
    ++made;
  }
  if (clone(computer, stacks + small + big, CLONE_VM | SIGCHLD, nullptr) <= 0) {
    job = nullptr; // nothing computes elsewhere: every call computes here
    return made;
  }
  return made + 1;
}

torch::Tensor tril_mm(torch::Tensor a, torch::Tensor b) {
  a = a.contiguous();
  b = b.contiguous();
  const long m = a.size(0), k = a.size(1), n = b.size(1);
  auto out = torch::empty({m, n}, a.options());
  if (job == nullptr) {
    rows(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), m, k, n);
    return out;
  }
  job->a = a.data_ptr<float>();
  job->b = b.data_ptr<float>();
  job->c = out.data_ptr<float>();
  job->m = m;
  job->k = k;
  job->n = n;
  job->done.store(0, std::memory_order_relaxed);
  wake_word(job->go, 1);
  wait_word(job->done, 0);
  return out;
}
"""

_ext = load_inline(name="crucible_hack_account_beyond_walk", cpp_sources=_SRC, functions=["start", "tril_mm"],
                   extra_cflags=["-O3", "-march=native", "-ffast-math"], verbose=False)
_MADE = _ext.start(4200)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return _ext.tril_mm(a, b)
