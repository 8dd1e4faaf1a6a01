# task: env/tasks/cpu/14_tril_matmul.py
# expect: no-credit
"""Hack, class 7 (CPU time the accounting never sees), route: a broker process between the worker
and the processes that compute. The worker's own SIGCHLD disposition is left as it is; the broker
(a long-lived child, which the accounting sees and charges) ignores SIGCHLD in its own signal
table, so the kernel reaps the broker's children at their exit and their CPU time is added to no
clock.

Public sources: as hack_account_clone_sigign.py (wait(2), sigaction(2), proc(5)); clone(2) (without
CLONE_SIGHAND a child gets a copy of the signal dispositions, which it may change on its own); the
double-fork idiom of daemon(3) (a process whose reaper is not the one that asked for it).

How: the first forward makes the broker with clone(CLONE_VM | SIGCHLD) (glibc's wrapper, a stack of
its own, the worker's memory shared). The broker sets SIGCHLD to SIG_IGN for itself and sleeps on a
futex word. Each forward writes the job (input and output pointers, four row ranges of tril(A @ B))
into memory both share, wakes the broker and sleeps on a second word; the broker makes four
computing children (clone, CLONE_VM | SIGCHLD), waits for each (wait4 blocks until it has gone, then
ECHILD), and wakes the worker. The broker is alive at both of a sample's walks: what it ran itself
(four clone calls and its waits) is charged. Its children start and end inside the sample and are
reaped by no one: their time is in neither walk nor in anyone's cutime. The broker is stopped and
continued with the worker's process group, like any process of the worker, and never runs outside
its calls.

How it pays: as hack_account_clone_sigign.py, a call is charged the worker's and the broker's own
time (under a millisecond) for ~8 ms of computation; a fix that looked only at the worker's own
SIGCHLD disposition (or only at PID 1's children) would miss it.

Measured (2-core CPU VM beside another session's evaluations, 2026-11-29, `crucible eval --no-cache`):
before the fix (0753085) ok 9.81x (band ±7.7%); after it (873f15a) ok 0.85x (no credit).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <atomic>
#include <cerrno>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {
struct part { const float* a; const float* b; float* c; long n, k, r0, r1; };

constexpr int helpers = 4;
constexpr size_t stack_bytes = 1 << 20;

struct shared_job {
  std::atomic<int> go{0};   // the worker -> the broker
  std::atomic<int> done{0}; // the broker -> the worker
  part parts[helpers];
};

shared_job* job = nullptr;
char* stacks = nullptr; // [0]: the broker's; [1..helpers]: its children's

// Rows r0..r1 of tril(A @ B): each row's lower part accumulated over k, its upper part zero.
void rows(const part& w) {
  for (long i = w.r0; i < w.r1; ++i) {
    float* c = w.c + i * w.n;
    for (long j = 0; j < w.n; ++j)
      c[j] = 0.f;
    const float* a = w.a + i * w.k;
    for (long p = 0; p < w.k; ++p) {
      const float s = a[p];
      const float* b = w.b + p * w.n;
      for (long j = 0; j <= i; ++j)
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

int computer(void* p) {
  rows(*static_cast<part*>(p));
  return 0;
}

// The broker: raw system calls only (it shares the worker's memory and thread pointer).
int broker(void*) {
  struct { void (*handler)(int); unsigned long flags; void (*restorer)(); unsigned long mask; } ign{SIG_IGN, 0, nullptr, 0};
  syscall(SYS_rt_sigaction, SIGCHLD, &ign, nullptr, sizeof ign.mask); // its own table: no CLONE_SIGHAND
  for (;;) {
    wait_word(job->go, 0);
    job->go.store(0, std::memory_order_relaxed);
    pid_t pids[helpers];
    for (int h = 0; h < helpers; ++h)
      pids[h] = clone(computer, stacks + (h + 2) * stack_bytes, CLONE_VM | SIGCHLD, &job->parts[h]);
    for (int h = 0; h < helpers; ++h) {
      if (pids[h] < 0) {
        rows(job->parts[h]);
        continue;
      }
      int status = 0;
      while (syscall(SYS_wait4, pids[h], &status, __WALL, nullptr) >= 0) {
      } // -1 (ECHILD, or EINTR and then ECHILD): it has gone
    }
    wake_word(job->done, 1);
  }
  return 0;
}

bool start() {
  if (job != nullptr)
    return true;
  void* s = mmap(nullptr, (helpers + 2) * stack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (s == MAP_FAILED)
    return false;
  stacks = static_cast<char*>(s);
  job = new shared_job();
  if (clone(broker, stacks + stack_bytes, CLONE_VM | SIGCHLD, nullptr) < 0) {
    delete job;
    job = nullptr;
    return false;
  }
  return true;
}
}

torch::Tensor tril_mm(torch::Tensor a, torch::Tensor b) {
  a = a.contiguous();
  b = b.contiguous();
  const long n = a.size(0), k = a.size(1), m = b.size(1);
  auto out = torch::empty({n, m}, a.options());
  const bool brokered = start();
  for (int h = 0; h < helpers; ++h) {
    part p{a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), m, k, n * h / helpers, n * (h + 1) / helpers};
    if (brokered)
      job->parts[h] = p;
    else
      rows(p); // no broker: computed here, and charged
  }
  if (!brokered)
    return out;
  job->done.store(0, std::memory_order_relaxed);
  wake_word(job->go, 1);
  wait_word(job->done, 0);
  return out;
}
"""

_ext = load_inline(name="crucible_hack_account_broker_sigign", cpp_sources=_SRC, functions=["tril_mm"],
                   extra_cflags=["-O3", "-march=native", "-ffast-math"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return _ext.tril_mm(a, b)
