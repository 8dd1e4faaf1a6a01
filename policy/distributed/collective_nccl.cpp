// policy/distributed/collective_nccl.cpp: the NCCL backend of collective.hpp. A non-blocking
// communicator whose creation and collectives are polled against a deadline; collectives run on the
// communicator's own stream, ordered after the caller's current stream by events.
#include "policy/distributed/collective.hpp"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace crucible::policy {

static_assert(sizeof(ncclUniqueId) == sizeof(nccl_id::bytes), "nccl_id must hold an ncclUniqueId");

namespace {

using clock = std::chrono::steady_clock;

std::string seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0')
    s += std::string{" ("} + last + ")";
  return s;
}

// Aborts `c` (its resources freed, every later call on it failing at once): "" when that worked,
// else "; ncclCommAbort failed at SITE: ..." for the caller's message.
std::string abort_comm(ncclComm_t c, const std::string& site) {
  const auto r = ncclCommAbort(c);
  return r == ncclSuccess ? std::string{} : "; ncclCommAbort failed at " + site + ": " + ncclGetErrorString(r);
}

// The same where no message goes back to a caller (a destructor, a communicator left behind):
// said on stderr.
void abort_quietly(ncclComm_t c, const std::string& site) {
  if (auto failed = abort_comm(c, site); !failed.empty())
    std::fprintf(stderr, "crucible: %s\n", failed.c_str() + 2);
}

result<ncclDataType_t> nccl_type(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return ncclFloat32;
    case torch::kBFloat16: return ncclBfloat16;
    case torch::kHalf: return ncclFloat16;
    case torch::kDouble: return ncclFloat64;
    case torch::kLong: return ncclInt64;
    case torch::kInt: return ncclInt32;
    case torch::kByte: return ncclUint8;
    case torch::kChar: return ncclInt8;
    default: return fail(errc::invalid_arg, "NCCL: no NCCL type for ", c10::toString(t));
  }
}

ncclRedOp_t nccl_op(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::avg: return ncclAvg;
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
  }
  return ncclSum;
}

// Waits by yielding for the first millisecond, then sleeps a little longer each round. A
// non-blocking communicator hands each collective's launch to a thread of NCCL's own and answers
// ncclInProgress until that thread has launched it (tens to hundreds of microseconds); the
// caller may issue nothing else on the communicator meanwhile. Sleeping there (20 µs, plus the
// kernel's timer slack) made every 25 MB all-reduce of two ranks take 342 µs against
// torch.distributed's 114 µs. Long waits still cost the host little.
class backoff {
public:
  void pause() {
    const auto waited = std::chrono::steady_clock::now() - start_;
    if (waited < std::chrono::milliseconds(1))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(waited < std::chrono::milliseconds(20) ? 20 : 200));
  }

private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The communicator's asynchronous state once it has left ncclInProgress, or ncclInProgress if it
// has not by `timeout` after `start` (an error of the query itself is returned as the state).
ncclResult_t settled_state(ncclComm_t comm, clock::time_point start, std::chrono::milliseconds timeout) {
  for (backoff b;; b.pause()) {
    ncclResult_t state = ncclSuccess;
    const auto q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess)
      return q;
    if (state != ncclInProgress || clock::now() - start > timeout)
      return state;
  }
}

class nccl_communicator;

struct nccl_work final : detail::work_impl {
  std::shared_ptr<nccl_communicator> comm;
  cudaEvent_t done = nullptr;
  std::string what;
  clock::time_point issued;
  ~nccl_work() override;
  result<void> wait() override;
};

class nccl_communicator final : public communicator, public std::enable_shared_from_this<nccl_communicator> {
public:
  nccl_communicator(int rank, int size, int device, std::chrono::milliseconds timeout,
                    std::shared_ptr<launch_rendezvous> together)
    : rank_(rank), size_(size), device_(device), timeout_(timeout), together_(std::move(together)),
      stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(device))) {}

  ~nccl_communicator() override {
    if (together_)
      together_->leave(rank_, "its communicator was closed");
    if (comm_ == nullptr)
      return;
    // Abort, not finalize + destroy: both of those wait for the other ranks (finalize until the
    // communicator is globally quiescent, destroy as an intra-node collective), so ranks that
    // are threads of one process, destroyed one after the other, would wait on each other. By
    // now no work handle is left (each holds the communicator), so every collective this rank
    // waited for is complete and abort frees only resources.
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    abort_quietly(comm_, CRUCIBLE_SITE());
  }

  // Two steps. The communicator is first made non-blocking, so that its creation is polled
  // against the deadline (a rank that never joins fails with a timeout, not a hang). It is then
  // split, all ranks together, into a blocking one for the collectives: a non-blocking
  // communicator hands every collective's launch to a new thread of NCCL's own and answers
  // ncclInProgress until it has run, which made a 25 MB all-reduce of two ranks on an H200 take
  // 158-178 µs against 112-119 µs blocking and torch.distributed's (docs/PERFORMANCE.md). A
  // blocking launch waits for no peer once every connection exists, so connections are made at
  // creation (NCCL_RUNTIME_CONNECT=0 unless the environment says otherwise); completion is still
  // polled against the deadline in wait(). Should the split fail, the non-blocking communicator
  // is kept.
  result<void> init(const nccl_id& id) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    // Once per process, before any of its ranks' threads enters NCCL (which reads it at creation).
    static std::once_flag eager_connections;
    std::call_once(eager_connections, [] { ::setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0); });
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclUniqueId uid;
    std::memcpy(&uid, id.bytes.data(), sizeof uid);
    const auto start = clock::now();
    const auto r = ncclCommInitRankConfig(&comm_, size_, uid, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      auto e = fail(errc::device, "NCCL init ", where(), ": ", nccl_text(r, comm_));
      if (comm_ != nullptr)
        e.message += abort_comm(comm_, CRUCIBLE_SITE());
      comm_ = nullptr;
      return e;
    }
    if (auto p = poll_async("init", start); !p)
      return p;
    ncclConfig_t blocking = NCCL_CONFIG_INITIALIZER;
    blocking.blocking = 1;
    ncclComm_t child = nullptr;
    const auto split_start = clock::now();
    auto s = ncclCommSplit(comm_, /*color=*/0, /*key=*/rank_, &child, &blocking);
    if (s != ncclSuccess && s != ncclInProgress) {
      if (child != nullptr)
        abort_quietly(child, CRUCIBLE_SITE());
      return {}; // keep the non-blocking communicator
    }
    // The split runs on the parent's terms: in the background, the parent in progress until done.
    if (auto p = poll_async("split", split_start); !p) {
      auto e = p.error();
      if (child != nullptr)
        e.message += abort_comm(child, CRUCIBLE_SITE());
      return e;
    }
    if (child == nullptr)
      return {};
    if (settled_state(child, split_start, timeout_) == ncclSuccess) {
      abort_quietly(comm_, CRUCIBLE_SITE()); // the child has resources of its own (splitShare 0)
      comm_ = child;
    } else {
      abort_quietly(child, CRUCIBLE_SITE());
    }
    return {};
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  torch::Device device() const noexcept override {
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_));
  }
  const char* backend() const noexcept override { return "nccl"; }
  std::chrono::milliseconds timeout() const noexcept override { return timeout_; }

  result<work> all_reduce(torch::Tensor t, reduce_op op) override {
    if (auto r = check("all_reduce", t); !r)
      return r.error();
    auto type = nccl_type(t.scalar_type());
    if (!type)
      return type.error();
    return issue(std::string{"all_reduce("} + to_string(op) + ")", {t}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<std::size_t>(t.numel()), *type, nccl_op(op), c, s);
    });
  }

  result<work> reduce_scatter(torch::Tensor in, torch::Tensor out, reduce_op op) override {
    if (auto r = check("reduce_scatter", in); !r)
      return r.error();
    if (auto r = check("reduce_scatter", out); !r)
      return r.error();
    if (in.numel() != out.numel() * size_ || in.scalar_type() != out.scalar_type())
      return fail(errc::invalid_arg, "reduce_scatter: input of ", std::to_string(in.numel()), " for an output of ",
                  std::to_string(out.numel()), " over ", std::to_string(size_), " ranks (or dtypes differ)");
    auto type = nccl_type(in.scalar_type());
    if (!type)
      return type.error();
    return issue(std::string{"reduce_scatter("} + to_string(op) + ")", {in, out}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<std::size_t>(out.numel()), *type, nccl_op(op),
                               c, s);
    });
  }

  result<work> all_gather(torch::Tensor in, torch::Tensor out) override {
    if (auto r = check("all_gather", in); !r)
      return r.error();
    if (auto r = check("all_gather", out); !r)
      return r.error();
    if (out.numel() != in.numel() * size_ || in.scalar_type() != out.scalar_type())
      return fail(errc::invalid_arg, "all_gather: input of ", std::to_string(in.numel()), " for an output of ",
                  std::to_string(out.numel()), " over ", std::to_string(size_), " ranks (or dtypes differ)");
    auto type = nccl_type(in.scalar_type());
    if (!type)
      return type.error();
    return issue("all_gather", {in, out}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<std::size_t>(in.numel()), *type, c, s);
    });
  }

  result<work> broadcast(torch::Tensor t, int root) override {
    if (auto r = check("broadcast", t); !r)
      return r.error();
    if (root < 0 || root >= size_)
      return fail(errc::invalid_arg, "broadcast: root ", std::to_string(root), " is not a rank of ",
                  std::to_string(size_));
    auto type = nccl_type(t.scalar_type());
    if (!type)
      return type.error();
    return issue("broadcast(root " + std::to_string(root) + ")", {t}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<std::size_t>(t.numel()), *type, root, c, s);
    });
  }

  result<void> barrier() override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    auto t = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat).device(device()));
    auto w = all_reduce(t, reduce_op::sum);
    if (!w)
      return w.error();
    return w->wait();
  }

  // "rank 1 of 2 on cuda:1"
  std::string where() const {
    return "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " on cuda:" + std::to_string(device_);
  }

  // Polls the communicator's asynchronous state until it leaves ncclInProgress. On an error or
  // past the deadline the communicator is aborted.
  result<void> poll_async(const std::string& what, clock::time_point start) {
    const auto state = settled_state(comm_, start, timeout_);
    if (state == ncclSuccess)
      return {};
    if (state != ncclInProgress)
      return abort(errc::device, "NCCL " + what + " (" + where() + "): " + nccl_text(state, comm_));
    return abort(errc::timeout, "NCCL " + what + " (" + where() + "): not complete after " + seconds(timeout_));
  }

  // Aborts the communicator (every later call fails at once) and returns the error.
  crucible::error abort(errc code, std::string message) {
    if (together_)
      together_->leave(rank_, message);
    if (comm_ != nullptr) {
      message += "; communicator aborted" + abort_comm(comm_, CRUCIBLE_SITE());
      comm_ = nullptr;
    }
    aborted_ = message;
    return crucible::error{code, std::move(message)};
  }

  ncclComm_t comm() const noexcept { return comm_; }
  const std::string& aborted() const noexcept { return aborted_; }

private:
  result<void> check(const char* what, const torch::Tensor& t) const {
    if (!t.defined() || !t.is_cuda() || t.get_device() != device_ || !t.is_contiguous())
      return fail(errc::invalid_arg, what, " (", where(), "): tensors must be defined, contiguous and on cuda:",
                  std::to_string(device_));
    return {};
  }

  template <class F>
  result<work> issue(std::string what, std::initializer_list<torch::Tensor> tensors, F&& call) {
    if (comm_ == nullptr)
      return fail(errc::cancelled, what, " (", where(), "): the communicator was aborted: ", aborted_);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    const auto issued = clock::now();
    // The collective reads what the caller's stream has written so far.
    auto current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_));
    cudaEvent_t ready = nullptr;
    if (const auto e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming); e != cudaSuccess)
      return fail(errc::device, what, " (", where(), "): cudaEventCreate failed at ", CRUCIBLE_SITE(), ": ",
                  cudaGetErrorString(e));
    // The ranks of this process launch together: none is left in another CUDA call while a
    // peer's kernel waits for its part (launch_rendezvous).
    if (together_)
      if (auto a = together_->arrive(rank_, "NCCL " + what + ": launching"); !a) {
        const auto destroyed = cudaEventDestroy(ready);
        return abort(a.error().code, a.error().message
                                       + (destroyed == cudaSuccess ? std::string{}
                                                                   : std::string{"; cudaEventDestroy failed at "}
                                                                       + CRUCIBLE_SITE() + ": " + cudaGetErrorString(destroyed)));
      }
    cudaError_t e = cudaEventRecord(ready, current.stream());
    if (e == cudaSuccess)
      e = cudaStreamWaitEvent(stream_.stream(), ready, 0);
    const auto destroyed = cudaEventDestroy(ready); // released once recorded and waited on
    if (e == cudaSuccess)
      e = destroyed;
    if (e != cudaSuccess)
      return abort(errc::device, "NCCL " + what + " (" + where() + "): ordering after the caller's stream failed at "
                                   + CRUCIBLE_SITE() + ": " + cudaGetErrorString(e));
    // The caching allocator must not hand these blocks out again before the collective is done.
    for (const auto& t : tensors)
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    const auto r = call(comm_, stream_.stream());
    if (r == ncclInProgress) {
      if (auto p = poll_async(what, issued); !p)
        return p.error();
    } else if (r != ncclSuccess) {
      return abort(errc::device, "NCCL " + what + " (" + where() + "): " + nccl_text(r, comm_));
    }
    if (together_)
      if (auto a = together_->arrive(rank_, "NCCL " + what + ": launched"); !a)
        return abort(a.error().code, a.error().message);
    auto w = std::make_shared<nccl_work>();
    w->comm = shared_from_this();
    w->what = std::move(what);
    w->issued = issued;
    if (const auto e = cudaEventCreateWithFlags(&w->done, cudaEventDisableTiming); e != cudaSuccess)
      return fail(errc::device, w->what, " (", where(), "): cudaEventCreate failed at ", CRUCIBLE_SITE(), ": ",
                  cudaGetErrorString(e));
    if (const auto e = cudaEventRecord(w->done, stream_.stream()); e != cudaSuccess)
      return abort(errc::device, "NCCL " + w->what + " (" + where() + "): cudaEventRecord failed at " + CRUCIBLE_SITE()
                                   + ": " + cudaGetErrorString(e));
    return work{std::move(w)};
  }

  int rank_, size_, device_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<launch_rendezvous> together_;
  c10::cuda::CUDAStream stream_;
  ncclComm_t comm_ = nullptr;
  std::string aborted_;
};

nccl_work::~nccl_work() {
  // Nothing goes back from a destructor: a failure is said on stderr, with its site.
  if (done != nullptr)
    if (const auto e = cudaEventDestroy(done); e != cudaSuccess)
      std::fprintf(stderr, "crucible: NCCL %s: cudaEventDestroy failed at %s: %s\n", what.c_str(),
                   CRUCIBLE_SITE().c_str(), cudaGetErrorString(e));
}

result<void> nccl_work::wait() {
  c10::cuda::CUDAGuard guard(comm->device().index());
  backoff b;
  for (;;) {
    const auto q = cudaEventQuery(done);
    if (q == cudaSuccess)
      break;
    if (q != cudaErrorNotReady)
      return comm->abort(errc::device, what + " (" + comm->where() + "): " + cudaGetErrorString(q));
    if (comm->comm() == nullptr)
      return fail(errc::cancelled, what, " (", comm->where(), "): the communicator was aborted: ", comm->aborted());
    ncclResult_t state = ncclSuccess;
    if (const auto q = ncclCommGetAsyncError(comm->comm(), &state); q != ncclSuccess)
      state = q; // the query itself failed: that is the error to report
    if (state != ncclSuccess && state != ncclInProgress)
      return comm->abort(errc::device, "NCCL " + what + " (" + comm->where() + "): " + nccl_text(state, comm->comm()));
    if (clock::now() - issued > comm->timeout())
      return comm->abort(errc::timeout, "NCCL " + what + " (" + comm->where() + "): not complete after " +
                                          seconds(comm->timeout()) + " (a peer rank is missing or stuck)");
    b.pause();
  }
  // Later work on the caller's stream sees the collective's output.
  if (const auto e = cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(comm->device().index()).stream(), done, 0);
      e != cudaSuccess)
    return comm->abort(errc::device, what + " (" + comm->where() + "): cudaStreamWaitEvent failed at " + CRUCIBLE_SITE()
                                       + ": " + cudaGetErrorString(e));
  return {};
}

} // namespace

result<nccl_id> nccl_id::generate() {
  ncclUniqueId uid;
  const auto r = ncclGetUniqueId(&uid);
  if (r != ncclSuccess)
    return fail(errc::device, "ncclGetUniqueId: ", nccl_text(r, nullptr));
  nccl_id id;
  std::memcpy(id.bytes.data(), &uid, sizeof uid);
  return id;
}

result<std::shared_ptr<communicator>> make_nccl_communicator(const nccl_id& id, int rank, int size, int device,
                                                             std::chrono::milliseconds timeout,
                                                             std::shared_ptr<launch_rendezvous> together) {
  if (size <= 0 || rank < 0 || rank >= size)
    return fail(errc::invalid_arg, "NCCL: rank ", std::to_string(rank), " of ", std::to_string(size));
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    (void) cudaGetLastError();
    return fail(errc::device, "NCCL: cuda:", std::to_string(device), " is not a device of this process (",
                std::to_string(count), " visible)");
  }
  if (together && (together->ranks() > size || rank >= together->ranks()))
    return fail(errc::invalid_arg, "NCCL: rank ", std::to_string(rank), " of ", std::to_string(size),
                " with a launch rendezvous of ", std::to_string(together->ranks()), " ranks");
  auto c = std::make_shared<nccl_communicator>(rank, size, device, timeout, std::move(together));
  if (auto r = c->init(id); !r)
    return r.error();
  return std::shared_ptr<communicator>(std::move(c));
}

} // namespace crucible::policy
