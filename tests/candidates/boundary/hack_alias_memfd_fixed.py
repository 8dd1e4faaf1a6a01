# task: tests/tasks/relu_as_given.py
# expect: rejected runtime:aliased_output
"""Hack, class 9 (an output that is its input by another address), route: memfd_create and mmap
MAP_FIXED over the input buffer's pages, in the untimed call before a sample, and a second
mapping of the same memfd elsewhere, handed back as the output of the timed call.

Public sources: memfd_create(2) and mmap(2) (MAP_SHARED mappings of one file at two addresses see
the same pages; MAP_FIXED replaces whatever was mapped there); the "mirrored ring buffer" idiom
(one memfd mapped twice, back to back: e.g. the Linux kernel's perf ring buffers, Chromium's
and LMAX's virtual-memory ring buffers); tests/candidates/hack_input_view.py (the input itself,
refused by runtime:aliased_output).

How: the evaluator refuses an output whose address range overlaps an input buffer's
(env/eval/boundary.cpp, time_sample: `addr < ib.addr + ib.bytes && ib.addr < addr + span`): it compares
virtual addresses. Every timed sample is preceded by an untimed call on the same buffers (the last
sample's inputs), and the evaluator writes the sample's inputs into those buffers while the worker
is stopped (process_vm_writev: into whatever the worker's pages at those addresses are). In a call
whose input is not yet in a range of its own, the module computes the ReLU honestly (its own C++
kernel), then copies the pages that hold the input into a memfd, maps the memfd over them with
MAP_FIXED (same bytes, now the memfd's), and maps the memfd a second time elsewhere. In a call whose
input lies in such a range (the timed call after the untimed one, and trial 0's second call), after
checking 4096 evenly spaced elements of x for a negative value (an aten operator: the profiled call
is not empty), it returns a tensor made with from_blob over the second mapping at the input's
offset: contiguous, of the input's dtype and shape, at an address no input buffer covers. The
evaluator reads it there: the input's bytes, which ReLU leaves as they are on this task's inputs
(torch.rand; INPUT_DOMAIN "as-given": distributions 0, 1 and 4 only). Its 0xFF poison after the
sample lands in the input buffer too (after its input check), and the next round's buffers are new.
The untimed call before each sample computes honestly (its inputs are the poisoned last ones: the
check finds a NaN) and remaps.

How it pays: a timed call is the harness's own per-call work and a 4096-element check, where the
reference reads and writes 16 MiB; the physics floor (half an in-cache fill of 16 MiB, ~0.1 ms)
stays below it. A first version checked every element (x.min(), one read of 16 MiB): 1.96x.

Measured (2-core CPU VM beside another session's evaluations, 2026-11-29, `crucible eval --no-cache`):
before the fix (0753085) ok 2.49x (band ±6.9%); after it (873f15a) rejected runtime:aliased_output (by physical frame).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <cstring>
#include <sys/mman.h>
#include <sys/syscall.h>
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
  // The memfd still backs x's pages (a freed buffer's range may hold another mapping now).
  const int64_t k = x.numel();
  const float* mine = x.data_ptr<float>();
  const float* there = reinterpret_cast<const float*>(at);
  for (int64_t i = 0; i < k; i += k / 61 + 1)
    if (std::memcmp(mine + i, there + i, 4) != 0)
      return torch::Tensor();
  return torch::from_blob(at, x.sizes(), x.strides(), x.options());
}

// x's pages moved into a memfd, mapped where they were and once more elsewhere.
bool remap(torch::Tensor x) {
  const auto a = reinterpret_cast<uintptr_t>(x.data_ptr());
  const uintptr_t lo = a & ~(page - 1), hi = (a + x.nbytes() + page - 1) & ~(page - 1);
  const size_t len = hi - lo;
  const int fd = static_cast<int>(syscall(SYS_memfd_create, "in", 0));
  if (fd < 0)
    return false;
  if (ftruncate(fd, static_cast<off_t>(len)) != 0) {
    close(fd);
    return false;
  }
  void* view = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (view == MAP_FAILED) {
    close(fd);
    return false;
  }
  std::memcpy(view, reinterpret_cast<void*>(lo), len); // the pages as they are: x and its neighbours
  if (mmap(reinterpret_cast<void*>(lo), len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    munmap(view, len);
    close(fd);
    return false;
  }
  drop(previous);
  previous = current;
  current = region{lo, hi, static_cast<char*>(view), fd};
  return true;
}
"""

_ext = load_inline(name="crucible_hack_alias_memfd_fixed", cpp_sources=_SRC, functions=["relu", "lookup", "remap"],
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
