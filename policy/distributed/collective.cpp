// policy/distributed/collective.cpp: the in-process backend (ranks as threads, CPU tensors) and
// what every backend shares: work handles, host-number reductions, NCCL ids as text.
#include "policy/distributed/collective.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "core/hex.hpp"

namespace crucible::policy {

const char* to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::avg: return "avg";
    case reduce_op::max: return "max";
    case reduce_op::min: return "min";
  }
  return "?";
}

result<void> work::wait() {
  if (done_ || !impl_)
    return done_ ? outcome_ : result<void>{};
  outcome_ = impl_->wait();
  done_ = true;
  impl_.reset();
  return outcome_;
}

result<void> all_reduce_host(communicator& comm, std::span<double> values, reduce_op op) {
  if (values.empty())
    return {};
  torch::NoGradGuard no_grad;
  auto host = torch::from_blob(values.data(), {static_cast<std::int64_t>(values.size())}, torch::kDouble);
  auto t = host.to(comm.device(), /*non_blocking=*/false, /*copy=*/true);
  auto w = comm.all_reduce(t, op);
  if (!w)
    return w.error();
  if (auto r = w->wait(); !r)
    return r;
  host.copy_(t.cpu());
  return {};
}

std::string nccl_id::to_hex() const {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (auto b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

result<nccl_id> nccl_id::from_hex(std::string_view hex) {
  nccl_id id;
  if (hex.size() != id.bytes.size() * 2)
    return fail(errc::invalid_arg, "NCCL id: expected ", std::to_string(id.bytes.size() * 2), " hex digits, got ",
                std::to_string(hex.size()), " characters");
  for (std::size_t i = 0; i < id.bytes.size(); ++i) {
    const int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return fail(errc::invalid_arg, "NCCL id: character ", std::to_string(hi < 0 ? 2 * i : 2 * i + 1),
                  " is not a hex digit");
    id.bytes[i] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return id;
}

// ---- in-process backend ----------------------------------------------------------------------

namespace {

enum class op_kind : std::uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, barrier };

const char* name_of(op_kind k) {
  switch (k) {
    case op_kind::all_reduce: return "all_reduce";
    case op_kind::reduce_scatter: return "reduce_scatter";
    case op_kind::all_gather: return "all_gather";
    case op_kind::broadcast: return "broadcast";
    case op_kind::barrier: return "barrier";
  }
  return "?";
}

// What one rank asked for: every rank of a collective must ask for the same.
struct call_desc {
  op_kind kind = op_kind::barrier;
  reduce_op op = reduce_op::sum;
  int root = 0;
  std::int64_t numel = 0; // of the input
  torch::ScalarType dtype = torch::kFloat;

  bool operator==(const call_desc&) const = default;
  std::string text() const {
    std::string s = name_of(kind);
    if (kind == op_kind::all_reduce || kind == op_kind::reduce_scatter)
      s += std::string{"("} + to_string(op) + ")";
    if (kind == op_kind::broadcast)
      s += "(root " + std::to_string(root) + ")";
    if (kind != op_kind::barrier)
      s += " of " + std::to_string(numel) + " " + c10::toString(dtype);
    return s;
  }
};

std::string seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

torch::Tensor reduce_in_rank_order(const std::vector<torch::Tensor>& in, reduce_op op) {
  auto r = in[0].clone();
  for (std::size_t i = 1; i < in.size(); ++i) {
    if (op == reduce_op::sum || op == reduce_op::avg)
      r.add_(in[i]);
    else if (op == reduce_op::max)
      r = torch::maximum(r, in[i]);
    else
      r = torch::minimum(r, in[i]);
  }
  if (op == reduce_op::avg)
    r.div_(static_cast<double>(in.size()));
  return r;
}

} // namespace

struct inproc_group::state {
  struct pending {
    call_desc desc;
    int first_rank = -1;
    std::vector<torch::Tensor> inputs;
    std::vector<bool> present;
    int arrived = 0, departed = 0;
    bool done = false;
    torch::Tensor result;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::uint64_t, pending> ops; // by sequence number: the k-th collective of every rank
  std::vector<bool> joined;
  bool aborted = false;
  std::string abort_reason;

  // Rank `rank`'s part in collective number `seq`; returns the combined result (undefined for a
  // barrier). Runs on the rank's worker thread.
  result<torch::Tensor> meet(int rank, int size, std::uint64_t seq, const call_desc& desc, torch::Tensor input,
                             std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const std::string who = desc.text() + " #" + std::to_string(seq) + " (rank " + std::to_string(rank) + " of " +
                            std::to_string(size) + ")";
    std::unique_lock<std::mutex> lock(mu);
    if (aborted)
      return fail(errc::cancelled, who, ": the in-process group was aborted: ", abort_reason);
    auto& op = ops[seq];
    if (op.arrived == 0) {
      op.desc = desc;
      op.first_rank = rank;
      op.inputs.resize(static_cast<std::size_t>(size));
      op.present.assign(static_cast<std::size_t>(size), false);
    } else if (!(op.desc == desc)) {
      abort_locked(who + ": rank " + std::to_string(rank) + " called " + desc.text() + " but rank " +
                   std::to_string(op.first_rank) + " called " + op.desc.text());
      return fail(errc::invalid_arg, abort_reason);
    }
    op.inputs[static_cast<std::size_t>(rank)] = std::move(input);
    op.present[static_cast<std::size_t>(rank)] = true;
    if (++op.arrived == size) {
      switch (desc.kind) {
        case op_kind::all_reduce:
        case op_kind::reduce_scatter: op.result = reduce_in_rank_order(op.inputs, desc.op); break;
        case op_kind::all_gather: op.result = torch::cat(op.inputs); break;
        case op_kind::broadcast: op.result = op.inputs[static_cast<std::size_t>(desc.root)].clone(); break;
        case op_kind::barrier: break;
      }
      op.inputs.clear(); // the callers' tensors are theirs again once done is seen
      op.done = true;
      cv.notify_all();
    } else if (!cv.wait_until(lock, deadline, [&] { return op.done || aborted; })) {
      std::string missing;
      for (int r = 0; r < size; ++r)
        if (!op.present[static_cast<std::size_t>(r)])
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      abort_locked(who + ": timed out after " + seconds(timeout) + " waiting for rank" +
                   (op.arrived + 1 < size ? "s " : " ") + missing + " to join");
      return fail(errc::timeout, abort_reason);
    }
    if (!op.done)
      return fail(errc::cancelled, who, ": the in-process group was aborted: ", abort_reason);
    auto out = op.result;
    if (++op.departed == size)
      ops.erase(seq);
    return out;
  }

  void abort_locked(std::string reason) {
    if (!aborted) {
      aborted = true;
      abort_reason = std::move(reason);
    }
    cv.notify_all();
  }
};

namespace {

// One rank of an in-process group: collectives run in issue order on a worker thread.
class inproc_communicator final : public communicator {
public:
  inproc_communicator(std::shared_ptr<inproc_group> group, inproc_group::state* s, int rank, int size,
                      std::chrono::milliseconds timeout)
    : group_(std::move(group)), s_(s), rank_(rank), size_(size), timeout_(timeout) {
    worker_ = std::thread([this] { run(); });
  }

  ~inproc_communicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    cv_.notify_all();
    worker_.join();
    // Collectives issued after this rank left could never complete: fail them at once.
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->abort_locked("rank " + std::to_string(rank_) + "'s communicator was destroyed");
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  torch::Device device() const noexcept override { return torch::kCPU; }
  const char* backend() const noexcept override { return "inproc"; }
  std::chrono::milliseconds timeout() const noexcept override { return timeout_; }

  result<work> all_reduce(torch::Tensor t, reduce_op op) override {
    if (auto r = check(op_kind::all_reduce, t); !r)
      return r.error();
    if (op == reduce_op::avg && !torch::isFloatingType(t.scalar_type()))
      return fail(errc::invalid_arg, "all_reduce(avg): ", c10::toString(t.scalar_type()), " is not a floating type");
    call_desc d{op_kind::all_reduce, op, 0, t.numel(), t.scalar_type()};
    return issue(d, t, [t](const torch::Tensor& r) mutable { t.copy_(r); });
  }

  result<work> reduce_scatter(torch::Tensor in, torch::Tensor out, reduce_op op) override {
    if (auto r = check(op_kind::reduce_scatter, in); !r)
      return r.error();
    if (auto r = check(op_kind::reduce_scatter, out); !r)
      return r.error();
    if (in.numel() != out.numel() * size_ || in.scalar_type() != out.scalar_type())
      return fail(errc::invalid_arg, "reduce_scatter: input of ", std::to_string(in.numel()), " ",
                  c10::toString(in.scalar_type()), " for an output of ", std::to_string(out.numel()), " ",
                  c10::toString(out.scalar_type()), " over ", std::to_string(size_), " ranks");
    call_desc d{op_kind::reduce_scatter, op, 0, in.numel(), in.scalar_type()};
    const auto chunk = out.numel(), offset = chunk * rank_;
    return issue(d, in, [out, chunk, offset](const torch::Tensor& r) mutable {
      out.view(-1).copy_(r.view(-1).narrow(0, offset, chunk));
    });
  }

  result<work> all_gather(torch::Tensor in, torch::Tensor out) override {
    if (auto r = check(op_kind::all_gather, in); !r)
      return r.error();
    if (auto r = check(op_kind::all_gather, out); !r)
      return r.error();
    if (out.numel() != in.numel() * size_ || in.scalar_type() != out.scalar_type())
      return fail(errc::invalid_arg, "all_gather: input of ", std::to_string(in.numel()), " ",
                  c10::toString(in.scalar_type()), " for an output of ", std::to_string(out.numel()), " ",
                  c10::toString(out.scalar_type()), " over ", std::to_string(size_), " ranks");
    call_desc d{op_kind::all_gather, reduce_op::sum, 0, in.numel(), in.scalar_type()};
    return issue(d, in.view(-1), [out](const torch::Tensor& r) mutable { out.view(-1).copy_(r); });
  }

  result<work> broadcast(torch::Tensor t, int root) override {
    if (auto r = check(op_kind::broadcast, t); !r)
      return r.error();
    if (root < 0 || root >= size_)
      return fail(errc::invalid_arg, "broadcast: root ", std::to_string(root), " is not a rank of ",
                  std::to_string(size_));
    call_desc d{op_kind::broadcast, reduce_op::sum, root, t.numel(), t.scalar_type()};
    const bool receiver = root != rank_;
    return issue(d, t, [t, receiver](const torch::Tensor& r) mutable {
      if (receiver)
        t.copy_(r.view(t.sizes()));
    });
  }

  result<void> barrier() override {
    auto w = issue(call_desc{}, torch::Tensor{}, [](const torch::Tensor&) {});
    if (!w)
      return w.error();
    return w->wait();
  }

private:
  struct future_work final : detail::work_impl {
    std::shared_future<result<void>> f;
    result<void> wait() override { return f.get(); }
  };

  result<void> check(op_kind k, const torch::Tensor& t) const {
    if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous())
      return fail(errc::invalid_arg, name_of(k), ": the in-process backend takes defined, contiguous CPU tensors");
    return {};
  }

  // Queues the collective; `finish` writes the combined result into the caller's tensors.
  result<work> issue(const call_desc& d, torch::Tensor input, std::function<void(const torch::Tensor&)> finish) {
    auto promise = std::make_shared<std::promise<result<void>>>();
    auto w = std::make_shared<future_work>();
    w->f = promise->get_future().share();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_)
        return fail(errc::cancelled, d.text(), ": the communicator is closing");
      queue_.push_back([this, d, input = std::move(input), finish = std::move(finish), promise]() mutable {
        torch::NoGradGuard no_grad;
        auto r = s_->meet(rank_, size_, seq_++, d, std::move(input), timeout_);
        if (!r) {
          promise->set_value(r.error());
          return;
        }
        finish(*r);
        promise->set_value(result<void>{});
      });
    }
    cv_.notify_one();
    return work{std::move(w)};
  }

  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return closing_ || !queue_.empty(); });
        if (queue_.empty())
          return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  std::shared_ptr<inproc_group> group_; // keeps the shared state alive
  inproc_group::state* s_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::uint64_t seq_ = 0; // worker thread only
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool closing_ = false;
  std::thread worker_;
};

} // namespace

inproc_group::inproc_group(int size, std::chrono::milliseconds timeout)
  : size_(size), timeout_(timeout), s_(std::make_unique<state>()) {
  s_->joined.assign(static_cast<std::size_t>(size), false);
}

inproc_group::~inproc_group() = default;

std::shared_ptr<inproc_group> inproc_group::create(int size, std::chrono::milliseconds timeout) {
  assert(size > 0);
  return std::shared_ptr<inproc_group>(new inproc_group(size, timeout));
}

result<std::shared_ptr<communicator>> inproc_group::join(int rank) {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (rank < 0 || rank >= size_)
      return fail(errc::invalid_arg, "inproc_group::join: rank ", std::to_string(rank), " is not in [0, ",
                  std::to_string(size_), ")");
    if (s_->joined[static_cast<std::size_t>(rank)])
      return fail(errc::invalid_arg, "inproc_group::join: rank ", std::to_string(rank), " has already joined");
    s_->joined[static_cast<std::size_t>(rank)] = true;
  }
  return std::shared_ptr<communicator>(
    std::make_shared<inproc_communicator>(shared_from_this(), s_.get(), rank, size_, timeout_));
}

// ---- launch rendezvous -----------------------------------------------------------------------

struct launch_rendezvous::state {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t generation = 0;
  int arrived = 0;
  std::vector<bool> here;
  int left = -1; // the first rank that left, or -1
  std::string why;
};

std::shared_ptr<launch_rendezvous> launch_rendezvous::create(int ranks, std::chrono::milliseconds timeout) {
  return std::shared_ptr<launch_rendezvous>(new launch_rendezvous(ranks, timeout));
}

launch_rendezvous::launch_rendezvous(int ranks, std::chrono::milliseconds timeout)
  : ranks_(ranks), timeout_(timeout), s_(std::make_unique<state>()) {
  s_->here.assign(static_cast<std::size_t>(std::max(ranks, 0)), false);
}

launch_rendezvous::~launch_rendezvous() = default;

result<void> launch_rendezvous::arrive(int rank, std::string_view what) {
  std::unique_lock<std::mutex> lock(s_->mu);
  auto gone = [&] {
    return fail(errc::cancelled, std::string{what}, " (rank ", std::to_string(rank), " of ", std::to_string(ranks_),
                "): rank ", std::to_string(s_->left), " left the group's launches: ", s_->why);
  };
  if (rank < 0 || rank >= ranks_)
    return fail(errc::invalid_arg, "launch rendezvous: rank ", std::to_string(rank), " is not in [0, ",
                std::to_string(ranks_), ")");
  if (s_->left >= 0)
    return gone();
  if (s_->here[static_cast<std::size_t>(rank)])
    return fail(errc::invalid_arg, "launch rendezvous: rank ", std::to_string(rank), " arrived twice at ", what);
  s_->here[static_cast<std::size_t>(rank)] = true;
  if (++s_->arrived == ranks_) {
    s_->arrived = 0;
    s_->here.assign(s_->here.size(), false);
    ++s_->generation;
    s_->cv.notify_all();
    return {};
  }
  const auto mine = s_->generation;
  const bool done = s_->cv.wait_for(lock, timeout_, [&] { return s_->generation != mine || s_->left >= 0; });
  if (s_->generation != mine)
    return {};
  if (done)
    return gone();
  std::string missing;
  for (int r = 0; r < ranks_; ++r)
    if (!s_->here[static_cast<std::size_t>(r)])
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  return fail(errc::timeout, std::string{what}, " (rank ", std::to_string(rank), " of ", std::to_string(ranks_),
              "): rank(s) ", missing, " of this process did not reach it within ", seconds(timeout_),
              " (held in another call, or issuing a different collective)");
}

void launch_rendezvous::leave(int rank, std::string_view why) {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (s_->left >= 0)
    return;
  s_->left = rank;
  s_->why = std::string{why};
  s_->cv.notify_all();
}

#ifndef CRUCIBLE_HAVE_CUDA
result<nccl_id> nccl_id::generate() {
  return fail(errc::unsupported, "NCCL: this build has no CUDA (configure with CRUCIBLE_CUDA=ON)");
}

result<std::shared_ptr<communicator>> make_nccl_communicator(const nccl_id&, int, int, int, std::chrono::milliseconds,
                                                             std::shared_ptr<launch_rendezvous>) {
  return fail(errc::unsupported, "NCCL: this build has no CUDA (configure with CRUCIBLE_CUDA=ON)");
}
#endif

} // namespace crucible::policy
