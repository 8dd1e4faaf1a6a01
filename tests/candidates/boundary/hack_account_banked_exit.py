# task: env/tasks/cpu/14_tril_matmul.py
# expect: no-credit
"""Hack, class 7 (CPU time the accounting never sees), route: CPU time banked in the untimed call
before a sample by a helper process, which then ends inside the timed sample, reaped by the
kernel, taking its whole history out of the sample's second reading. The candidate computes every
call itself, honestly, and is charged less than it ran.

Public sources: as hack_account_clone_sigign.py (wait(2) and sigaction(2) on SIGCHLD ignored;
proc(5), cutime/cstime); the accounting itself (env/eval/sandbox.cpp, worker::cpu_ns; env/eval/boundary.cpp,
cpu_charge_ms: a sample is charged the difference of two sums over the processes alive at each
reading, clamped at zero).

How: a sample's charge is (the sum over the processes alive after it) minus (the sum over those
alive before it). A process alive before and gone after, with nothing of it added to a living
process (its parent ignores SIGCHLD: no cutime), takes all the CPU time it ever ran out of the
second sum. Every timed sample is preceded by an untimed call on the same input buffers, and each
round's buffers are new (placement jitter): a call whose input lies where the last call's did is
the timed one. In any other call (the untimed one, the trials) the module computes tril(A @ B)
itself (a plain C++ loop), then, with SIGCHLD set to SIG_IGN in the worker, makes a helper with
clone(CLONE_VM | SIGCHLD) that burns 60% of the median CPU time its kernel has taken over its last
calls and sleeps on a futex word; the call waits for the burn (on the other core: wall time, which
no one charges) and returns. The timed call computes the same, releases the helper and waits until
it has gone (waitpid blocks until then, and fails with ECHILD). At the sample's first reading the
helper was alive with its banked time; at the second it is not there, and nothing of it is
anywhere. One helper at a time: a sleeping process is woken by every stop and continuation of
the worker's group, which the walk charges (the first version banked 400 helpers at load, and
their wake-ups, charged to every sample and added to every helper's history, drove the charge to
zero: runtime:below_floor).

How it pays: a call is charged ~40% of what it ran, plus the harness's per-call time; the same
loop honestly charged is 0.89x the reference (8.9 ms against 8.3 ms). A larger share banked
(90%, 75%) left the charge within its own noise of zero: runtime:recheck refused it ("independent
measurements of a large speedup disagree").

Measured (2-core CPU VM beside another session's evaluations, 2026-11-29, `crucible eval --no-cache`):
before the fix (0753085) this version ok 2.12x (band ±20.5%), then ok 2.04x, 2.02x, 2.15x
(`--repeat 3`, bands ±25%, ±18%, ±12%); the earlier versions (90% and 75% banked, or 400 helpers banked
at load) were refused below the floor or as disagreeing measurements, or 0.63x (a slow kernel); after it (873f15a) ok 0.82x (no credit).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <ctime>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {
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

long thread_cpu_ns() {
  timespec ts{};
  syscall(SYS_clock_gettime, CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

struct helper_state {
  std::atomic<int> banked{0};
  std::atomic<int> release{0};
  long burn_ns = 0;
  pid_t pid = -1;
};

constexpr size_t stack_bytes = 64 << 10;
char* stack = nullptr;
helper_state* waiting = nullptr; // a helper that has banked and sleeps, or none
uintptr_t last_input = 0;        // the previous call's first input
std::vector<long> spent_ns;      // what its own kernel took in the calls so far (CPU time)
volatile double sink = 0;

// A helper: burns its share of CPU time, says so, and sleeps until released; then it ends (the
// exit system call clone's wrapper makes). Raw system calls only: it shares the worker's memory
// and thread pointer.
int helper(void* p) {
  auto* h = static_cast<helper_state*>(p);
  double acc = 1.0;
  while (thread_cpu_ns() < h->burn_ns)
    for (int i = 0; i < 4096; ++i)
      acc = acc * 0.9999999 + 1e-9;
  sink = acc;
  h->banked.store(1, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<int*>(&h->banked), FUTEX_WAKE, 1, nullptr, nullptr, 0);
  while (h->release.load(std::memory_order_acquire) == 0)
    syscall(SYS_futex, reinterpret_cast<int*>(&h->release), FUTEX_WAIT, 0, nullptr, nullptr, 0);
  return 0;
}

void release_waiting() {
  if (waiting == nullptr)
    return;
  waiting->release.store(1, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<int*>(&waiting->release), FUTEX_WAKE, 1, nullptr, nullptr, 0);
  int status = 0;
  while (waitpid(waiting->pid, &status, __WALL) >= 0 || errno == EINTR) {
  } // ECHILD: it has ended and the kernel has released it, with its CPU time
  delete waiting;
  waiting = nullptr;
}

void bank(long burn_ns) {
  if (stack == nullptr) {
    signal(SIGCHLD, SIG_IGN); // the kernel reaps the helpers: nothing of theirs reaches a living clock
    void* s = mmap(nullptr, stack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (s == MAP_FAILED)
      return;
    stack = static_cast<char*>(s);
  }
  auto* h = new helper_state();
  h->burn_ns = burn_ns;
  h->pid = clone(helper, stack + stack_bytes, CLONE_VM | SIGCHLD, h);
  if (h->pid < 0) {
    delete h;
    return;
  }
  while (h->banked.load(std::memory_order_acquire) == 0) // it burns on the other core; this one sleeps
    syscall(SYS_futex, reinterpret_cast<int*>(&h->banked), FUTEX_WAIT, 0, nullptr, nullptr, 0);
  waiting = h;
}
}

torch::Tensor tril_mm(torch::Tensor a, torch::Tensor b) {
  a = a.contiguous();
  b = b.contiguous();
  const long m = a.size(0), k = a.size(1), n = b.size(1);
  auto out = torch::empty({m, n}, a.options());
  const auto here = reinterpret_cast<uintptr_t>(a.data_ptr());
  const bool timed = here == last_input; // the timed call runs on the buffers of the untimed one before it
  last_input = here;
  const long t0 = thread_cpu_ns();
  rows(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), m, k, n);
  const long spent = thread_cpu_ns() - t0;
  spent_ns.push_back(spent);
  if (timed) {
    release_waiting(); // its banked time leaves this sample's second reading
  } else if (waiting == nullptr) {
    // Outside the clock: 60% of the kernel's median CPU time over its last calls, banked for the
    // timed call that follows (a steady figure: the call's own time varies by a millisecond).
    std::vector<long> last(spent_ns.end() - std::min<size_t>(spent_ns.size(), 15), spent_ns.end());
    std::nth_element(last.begin(), last.begin() + last.size() / 2, last.end());
    bank(last[last.size() / 2] * 6 / 10);
  }
  return out;
}
"""

_ext = load_inline(name="crucible_hack_account_banked_exit", cpp_sources=_SRC, functions=["tril_mm"],
                   extra_cflags=["-O3", "-march=native", "-ffast-math"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return _ext.tril_mm(a, b)
