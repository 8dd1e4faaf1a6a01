// policy/distributed/collective.hpp: collectives between learner and engine ranks. Flat tensors go
// in; the same tensors come back reduced, scattered, gathered or broadcast, over NCCL between GPUs
// or between threads of one process on the CPU. Every collective has a deadline: one that does not
// complete in time fails with errc::timeout naming the operation, the rank and the timeout, and the
// communicator is aborted (later calls fail at once) instead of hanging.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <torch/torch.h>

#include "core/error.hpp"

namespace crucible::policy {

/// How all_reduce and reduce_scatter combine the ranks' values.
enum class reduce_op : std::uint8_t { sum, avg, max, min };

/// "sum", "avg", "max", "min".
const char* to_string(reduce_op op) noexcept;

namespace detail {
/// What a backend keeps for one issued collective (events, a future).
struct work_impl {
  virtual ~work_impl() = default;
  virtual result<void> wait() = 0;
};
} // namespace detail

/// Handle of an issued collective. Collectives are issued asynchronously: the tensors passed in
/// belong to the collective until wait() returns. Value type (copies share the handle); waiting
/// twice returns the first outcome again.
class work {
public:
  work() = default;
  explicit work(std::shared_ptr<detail::work_impl> impl) : impl_(std::move(impl)) {}

  /// Blocks until the collective completes, fails, or passes the communicator's timeout (then
  /// errc::timeout and the communicator is aborted). On a CUDA communicator the caller's current
  /// stream is also ordered after the collective. A default-constructed work is complete.
  result<void> wait();

private:
  std::shared_ptr<detail::work_impl> impl_;
  bool done_ = false;
  result<void> outcome_;
};

/// A group of `size()` ranks that run collectives together. Every rank must issue the same
/// collectives, with tensors of the same element count and dtype, in the same order. Tensors are
/// contiguous and live on device(); CUDA collectives run on the communicator's own stream, after
/// the work already queued on the caller's current stream. Not thread-safe: one owning thread
/// issues and waits (one communicator per learner thread). Non-copyable.
class communicator {
public:
  virtual ~communicator() = default;
  communicator() = default;
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  /// Where the tensors of this communicator live: cpu or cuda:N.
  virtual torch::Device device() const noexcept = 0;
  /// "nccl" or "inproc".
  virtual const char* backend() const noexcept = 0;
  /// How long a collective may take before it fails.
  virtual std::chrono::milliseconds timeout() const noexcept = 0;

  /// In place: every rank's `t` becomes op over all ranks' `t`.
  virtual result<work> all_reduce(torch::Tensor t, reduce_op op) = 0;
  /// `in` has size() x out.numel() elements; rank r's `out` becomes op over all ranks' chunk r of
  /// `in`.
  virtual result<work> reduce_scatter(torch::Tensor in, torch::Tensor out, reduce_op op) = 0;
  /// `out` has size() x in.numel() elements; chunk r of every rank's `out` becomes rank r's `in`.
  virtual result<work> all_gather(torch::Tensor in, torch::Tensor out) = 0;
  /// In place: every rank's `t` becomes rank `root`'s.
  virtual result<work> broadcast(torch::Tensor t, int root) = 0;
  /// Returns when every rank has called barrier() (or fails at the timeout).
  virtual result<void> barrier() = 0;
};

/// Blocking all_reduce of a few host numbers (batch totals, metrics): copied to the
/// communicator's device as float64, reduced, copied back.
result<void> all_reduce_host(communicator& comm, std::span<double> values, reduce_op op);

// ---- in-process backend ----------------------------------------------------------------------

/// Ranks as threads of one process, on CPU tensors: the backend of CPU runs and tests. Exact and
/// deterministic: reductions add the ranks' tensors in rank order (rank 0 + rank 1 + ...), so every
/// rank gets bit-identical results and a run repeats bit for bit. Each communicator runs its
/// collectives in issue order on a thread of its own, so work issued during a backward pass
/// overlaps with it. A collective that some rank does not join within the timeout fails on every
/// rank that did with errc::timeout, and the whole group is aborted; a mismatch between ranks
/// (operation, element count, dtype, root) fails with errc::invalid_arg naming both ranks' calls.
/// Thread-safe.
class inproc_group final : public std::enable_shared_from_this<inproc_group> {
public:
  /// A group of `size` ranks whose collectives time out after `timeout`.
  static std::shared_ptr<inproc_group> create(int size, std::chrono::milliseconds timeout);
  ~inproc_group();
  inproc_group(const inproc_group&) = delete;
  inproc_group& operator=(const inproc_group&) = delete;

  /// Rank `rank`'s communicator (once per rank; errc::invalid_arg for a bad or taken rank).
  result<std::shared_ptr<communicator>> join(int rank);
  int size() const noexcept { return size_; }

  struct state;

private:
  inproc_group(int size, std::chrono::milliseconds timeout);
  int size_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<state> s_;
};

// ---- NCCL backend ----------------------------------------------------------------------------

/// The ranks of one NCCL group that are threads of this process, launching each collective
/// together. An NCCL kernel spins on its device until every rank has launched its part; a rank
/// whose thread is meanwhile held in a CUDA call that waits for a peer's device (a lazy module
/// load, a free with peer access enabled, a pinned allocation) never launches, and the group
/// hangs with the peers' devices busy and its own idle. Ranks sharing a rendezvous wait at each
/// collective until all have reached it, launch, and wait until all have launched, so that no
/// rank runs other CUDA work while a peer's part is not queued. A rank that does not arrive within
/// the timeout, or that leaves (its communicator aborted or destroyed), fails the others' waits
/// at once with an error naming it. Thread-safe.
class launch_rendezvous {
public:
  /// `ranks` threads (ranks 0 .. ranks-1 of the group), each wait bounded by `timeout`.
  static std::shared_ptr<launch_rendezvous> create(int ranks, std::chrono::milliseconds timeout);
  ~launch_rendezvous();
  launch_rendezvous(const launch_rendezvous&) = delete;
  launch_rendezvous& operator=(const launch_rendezvous&) = delete;

  /// Waits until every rank has arrived at the same point (`what` names it in errors): the
  /// error names the ranks missing after the timeout, or the rank that left and why.
  result<void> arrive(int rank, std::string_view what);
  /// Rank `rank` takes no part any more: every wait, now and later, fails naming it and `why`.
  void leave(int rank, std::string_view why);
  int ranks() const noexcept { return ranks_; }

  struct state;

private:
  launch_rendezvous(int ranks, std::chrono::milliseconds timeout);
  int ranks_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<state> s_;
};

/// An NCCL unique id: made once (by the coordinator's chosen rank), sent to every rank as text,
/// turned into a communicator by each. Plain value.
struct nccl_id {
  std::array<std::uint8_t, 128> bytes{};

  /// A fresh id (ncclGetUniqueId; it names this host's bootstrap address). errc::unsupported in a
  /// build without CUDA, errc::device when NCCL fails.
  static result<nccl_id> generate();
  /// 256 lower-case hex digits.
  std::string to_hex() const;
  /// From to_hex()'s text; errc::invalid_arg naming what is wrong with it.
  static result<nccl_id> from_hex(std::string_view hex);
};

/// Rank `rank` of `size` on GPU `device` in the NCCL communicator of `id`. The communicator is
/// non-blocking: its creation and every collective are polled (ncclCommGetAsyncError) against
/// `timeout`, and on expiry or an asynchronous NCCL error it is aborted (ncclCommAbort) and the
/// call fails naming the operation, rank and timeout. Collectives run on a stream of the
/// communicator's own, ordered after the caller's current stream by events, and their tensors are
/// recorded on it for the caching allocator. errc::unsupported without CUDA, errc::device or
/// errc::timeout when creation fails.
///
/// `together`: the rendezvous of the group's ranks that are threads of this process (see
/// launch_rendezvous; null when this rank is the process's only one). Every rank of a process
/// must pass the same one.
result<std::shared_ptr<communicator>> make_nccl_communicator(const nccl_id& id, int rank, int size, int device,
                                                             std::chrono::milliseconds timeout,
                                                             std::shared_ptr<launch_rendezvous> together = nullptr);

} // namespace crucible::policy
