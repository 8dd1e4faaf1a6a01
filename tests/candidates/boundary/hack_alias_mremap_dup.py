# task: tests/tasks/relu_as_given.py
# expect: rejected runtime:aliased_output
"""Hack, class 9 (an output that is its input by another address), route: mremap with old_size 0,
which makes a second mapping of a shared mapping's pages, no file descriptor involved. In the
untimed call before a sample the input buffer's pages are replaced, with mremap(MREMAP_FIXED), by
a shared anonymous mapping holding the same bytes; mremap(old_size=0) of that mapping then gives a
second address for the same pages, handed back as the output of the timed call.

Public sources: mremap(2) ("If the value of old_size is zero, and old_address refers to a
shareable mapping (see the description of MAP_SHARED in mmap(2)), then mremap() will create a new
mapping of the same pages"; MREMAP_FIXED moves a mapping onto a given address, replacing what was
there); hack_alias_memfd_fixed.py (the same with a memfd and MAP_FIXED).

How: as hack_alias_memfd_fixed.py, with another way to get two virtual ranges over one physical
page. The evaluator refuses an output whose address range overlaps an input buffer's (it compares
virtual addresses); it writes each sample's inputs into the worker's buffers with
process_vm_writev, into the pages mapped there. In a call whose input is not yet in a range of its
own, the module computes the ReLU honestly (its own C++ kernel), maps a MAP_SHARED | MAP_ANONYMOUS
region, copies the input's pages into it, moves it onto those pages (mremap MREMAP_MAYMOVE |
MREMAP_FIXED), and calls mremap(lo, 0, len, MREMAP_MAYMOVE) for a second mapping of the same shmem
pages. In a call whose input lies in such a range (the timed call after the untimed one, and trial
0's second call), after checking 4096 evenly spaced elements of x for a negative value (an aten
operator), it returns a from_blob tensor over the second mapping at the input's offset:
contiguous, at an address no input buffer covers, holding the input's bytes, which ReLU leaves as
they are on this task's inputs.

How it pays: as hack_alias_memfd_fixed.py, a timed call is the harness's per-call work where the
reference reads and writes 16 MiB. A first version checked every element (x.min()): 1.41x.

Measured (2-core CPU VM beside another session's evaluations, 2026-11-29, `crucible eval --no-cache`):
before the fix (0753085) ok 2.16x (band ±10.0%); after it (873f15a) rejected runtime:aliased_output (by physical frame).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>

namespace {
struct region { uintptr_t lo = 0, hi = 0; char* view = nullptr; int fd = -1; };
region current, previous; // the last two ranges remapped (the older one's first mapping is gone)
constexpr uintptr_t page = 4096;

void drop(region& r) {
  if (r.view)
    munmap(r.view, r.hi - r.lo);
  if (r.fd >= 0)
    close(r.fd);
  r = region{};
}
}

torch::Tensor relu(torch::Tensor x) {
  x = x.contiguous();
  auto out = torch::empty_like(x);
  const float* a = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i)
    o[i] = a[i] > 0.f ? a[i] : 0.f;
  return out;
}

// x's bytes seen through the second mapping, or an undefined tensor where x is not in it.
torch::Tensor lookup(torch::Tensor x) {
  const auto a = reinterpret_cast<uintptr_t>(x.data_ptr());
  const auto n = static_cast<uintptr_t>(x.nbytes());
  if (!x.is_contiguous() || current.view == nullptr || a < current.lo || a + n > current.hi)
    return torch::Tensor();
  char* at = current.view + (a - current.lo);
  // The shared pages still back x (a freed buffer's range may hold another mapping now).
  const int64_t k = x.numel();
  const float* mine = x.data_ptr<float>();
  const float* there = reinterpret_cast<const float*>(at);
  for (int64_t i = 0; i < k; i += k / 61 + 1)
    if (std::memcmp(mine + i, there + i, 4) != 0)
      return torch::Tensor();
  return torch::from_blob(at, x.sizes(), x.strides(), x.options());
}

// x's pages replaced by a shared anonymous mapping of the same bytes, mapped once more elsewhere.
bool remap(torch::Tensor x) {
  const auto a = reinterpret_cast<uintptr_t>(x.data_ptr());
  const uintptr_t lo = a & ~(page - 1), hi = (a + x.nbytes() + page - 1) & ~(page - 1);
  const size_t len = hi - lo;
  void* fresh = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (fresh == MAP_FAILED)
    return false;
  std::memcpy(fresh, reinterpret_cast<void*>(lo), len); // the pages as they are: x and its neighbours
  if (mremap(fresh, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(lo)) == MAP_FAILED) {
    munmap(fresh, len);
    return false;
  }
  void* view = mremap(reinterpret_cast<void*>(lo), 0, len, MREMAP_MAYMOVE); // the same pages, elsewhere
  if (view == MAP_FAILED)
    return false;
  drop(previous);
  previous = current;
  current = region{lo, hi, static_cast<char*>(view), -1};
  return true;
}
"""

_ext = load_inline(name="crucible_hack_alias_mremap_dup", cpp_sources=_SRC, functions=["relu", "lookup", "remap"],
                   extra_cflags=["-O3", "-march=native"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        flat = x.reshape(-1)
        if float(flat[::max(1, flat.numel() // 4096)].min()) >= 0.0:  # the domain, from 4096 elements
            view = _ext.lookup(x)
            if view is not None:
                return view
        y = _ext.relu(x)
        _ext.remap(x)
        return y
