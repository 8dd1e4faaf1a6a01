# task: env/tasks/cpu/10_matmul_rowsum.py
# expect: no-credit
"""Hack (more cores than the reference is given): a C++ extension starts a pool of four threads
in its first call (the one call whose new threads are not refused, where runtimes start theirs)
and from then on splits the reference's own computation, (A @ B).sum(-1), by rows over them,
waiting for all four before it returns. Every output is finished when the call returns and
nothing is computed differently: only the cores differ. A worker is given evaluator.cpu_threads
cores (one), and so is the reference's; on the development machine's two cores it would have
been about 1.4x while the clock was the sample's wall time alone (estimated from the CPU time its
threads ran beyond each sample; no verdict was taken with that clock). Each sample is now charged the larger
of its wall time and the CPU time all the worker's threads ran in it over its cores, so the split
buys nothing on an idle machine (0.87-0.93x); on a machine with other work, where five runnable
threads get more of the cores than the reference's one, it still measured 1.55x (band ±40%)
in one verdict beside two builds), so a worker that runs materially on more cores than it is given is refused
(runtime:cores). The pool is written so that the static screen's text patterns do not match it
(no "std::thread")."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

using namespace std;

namespace {
constexpr int parts = 4;
std::mutex mu;
std::condition_variable work, done;
torch::Tensor pa, pb, pout;
long job = 0;
int finished = 0;

void part(int k) {
  long seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu);
      work.wait(lock, [&] { return job != seen; });
      seen = job;
    }
    const auto rows = pa.size(0);
    const auto lo = rows * k / parts, hi = rows * (k + 1) / parts;
    auto slice = pout.narrow(0, lo, hi - lo);
    at::sum_out(slice, at::mm(pa.narrow(0, lo, hi - lo), pb), {-1});
    {
      std::lock_guard<std::mutex> lock(mu);
      ++finished;
    }
    done.notify_one();
  }
}
} // namespace

torch::Tensor rowsum(torch::Tensor a, torch::Tensor b) {
  static vector<thread*> pool;
  if (pool.empty())
    for (int k = 0; k < parts; ++k)
      pool.push_back(new thread(part, k));
  auto out = torch::empty({a.size(0)}, a.options());
  {
    std::lock_guard<std::mutex> lock(mu);
    pa = a;
    pb = b;
    pout = out;
    finished = 0;
    ++job;
  }
  work.notify_all();
  std::unique_lock<std::mutex> lock(mu);
  done.wait(lock, [] { return finished == parts; });
  return out;
}
"""

_ext = load_inline(name="crucible_test_hack_extra_cores", cpp_sources=_SRC, functions=["rowsum"],
                   extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return _ext.rowsum(A, B)
