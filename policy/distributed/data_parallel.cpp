// policy/distributed/data_parallel.cpp: gradient buckets filled by autograd hooks and reduced over
// the ranks while the backward pass goes on; ZeRO-1's sharded AdamW and parameter all-gather.
#include "policy/distributed/data_parallel.hpp"

#include <array>
#include <cassert>
#include <chrono>
#include <cmath>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "core/sha256.hpp"

namespace crucible::policy {

namespace {

struct gradient_hook_impl final : torch::autograd::PostAccumulateGradHook {
  gradient_hook_impl(data_parallel* dp, std::size_t index) : dp_(dp), index_(index) {}
  void operator()(const torch::autograd::Variable&) override { dp_->on_gradient(index_); }
  data_parallel* dp_;
  std::size_t index_;
};

std::string str(std::int64_t v) { return std::to_string(v); }

} // namespace

std::vector<gradient_bucket> plan_gradient_buckets(std::span<const std::int64_t> numels, std::int64_t bucket_bytes,
                                                   int world_size) {
  const std::int64_t capacity = std::max<std::int64_t>(1, bucket_bytes / 4);
  const std::int64_t n = world_size > 0 ? world_size : 1;
  std::vector<gradient_bucket> out;
  for (std::size_t k = numels.size(); k-- > 0;) {
    if (out.empty() || (out.back().numel > 0 && out.back().numel + numels[k] > capacity))
      out.emplace_back();
    auto& b = out.back();
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += numels[k];
  }
  for (auto& b : out)
    b.padded = (b.numel + n - 1) / n * n;
  return out;
}

data_parallel::data_parallel(std::shared_ptr<communicator> comm, adamw& optimizer, const data_parallel_options& options)
  : comm_(std::move(comm)), optimizer_(optimizer), options_(options) {}

data_parallel::~data_parallel() {
  for (const auto& p : optimizer_.parameters())
    torch::autograd::impl::set_post_acc_grad_hooks(p.param, nullptr);
  // Collectives still in flight (an update that threw) finish before their buffers go.
  for (auto& w : works_)
    (void) w.wait();
}

result<std::unique_ptr<data_parallel>> data_parallel::create(std::shared_ptr<communicator> comm, adamw& optimizer,
                                                             const data_parallel_options& options,
                                                             const std::string& identity) {
  if (!comm)
    return fail(errc::invalid_arg, "data_parallel: no communicator");
  if (options.bucket_bytes < 4)
    return fail(errc::config, "learner.bucket_mb: a bucket must hold at least one float32 gradient");
  if (options.zero1 != optimizer.sharded())
    return fail(errc::invalid_arg, "data_parallel: learner.zero1 is ", options.zero1 ? "on" : "off",
                " but the optimiser was built ", optimizer.sharded() ? "sharded" : "unsharded");
  const auto& params = optimizer.parameters();
  const auto device = comm->device();
  for (const auto& p : params)
    if (p.param.device() != device)
      return fail(errc::invalid_arg, "data_parallel: parameter ", p.name, " is on ", p.param.device().str(),
                  " but the communicator (", comm->backend(), ") works on ", device.str());
  const auto dtype = params.front().param.scalar_type();
  if (options.zero1)
    for (const auto& p : params)
      if (p.param.scalar_type() != dtype)
        return fail(errc::config, "learner.zero1: the trainable parameters must share one dtype (", p.name, " is ",
                    c10::toString(p.param.scalar_type()), ", ", params.front().name, " ", c10::toString(dtype), ")");

  // Every rank must train the same parameters with the same plan: compare digests.
  crucible::sha256 h;
  for (const auto& p : params) {
    h.update(p.name);
    h.update(std::string{c10::toString(p.param.scalar_type())});
    for (auto d : p.param.sizes())
      h.update(std::to_string(d) + ",");
    h.update(";");
  }
  crucible::sha256 hi;
  hi.update(identity);
  const auto dp = h.finish(), di = hi.finish();
  auto word = [](const std::array<std::uint8_t, 32>& d, int k) {
    return static_cast<double>(std::uint32_t{d[4 * k]} << 24 | std::uint32_t{d[4 * k + 1]} << 16 |
                               std::uint32_t{d[4 * k + 2]} << 8 | std::uint32_t{d[4 * k + 3]});
  };
  std::vector<double> mine{word(dp, 0), word(dp, 1), word(di, 0), word(di, 1), static_cast<double>(options.bucket_bytes),
                           options.zero1 ? 1.0 : 0.0, options.overlap ? 1.0 : 0.0};
  auto lo = mine, hi_v = mine;
  if (auto r = all_reduce_host(*comm, lo, reduce_op::min); !r)
    return r.error();
  if (auto r = all_reduce_host(*comm, hi_v, reduce_op::max); !r)
    return r.error();
  static const char* what[] = {"the trainable parameters (names, shapes or dtypes)",
                               "the trainable parameters (names, shapes or dtypes)",
                               "the frozen base weights",
                               "the frozen base weights",
                               "learner.bucket_mb",
                               "learner.zero1",
                               "learner.overlap"};
  for (std::size_t k = 0; k < mine.size(); ++k)
    if (lo[k] != hi_v[k])
      return fail(errc::config, "data_parallel (rank ", std::to_string(comm->rank()), " of ",
                  std::to_string(comm->size()), "): the ranks disagree on ", what[k]);

  std::unique_ptr<data_parallel> self(new data_parallel(std::move(comm), optimizer, options));
  auto& c = *self->comm_;
  torch::NoGradGuard no_grad;
  if (options.broadcast_initial && c.size() > 1) {
    std::vector<work> pending;
    for (const auto& p : params) {
      auto w = c.broadcast(p.param, 0);
      if (!w)
        return w.error();
      pending.push_back(*w);
    }
    for (auto& w : pending)
      if (auto r = w.wait(); !r)
        return r.error();
    optimizer.sync_masters();
  }

  std::vector<std::int64_t> numels;
  for (const auto& p : params)
    numels.push_back(p.param.numel());
  self->buckets_ = plan_gradient_buckets(numels, options.bucket_bytes, c.size());
  self->slot_.resize(params.size());
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  for (std::size_t b = 0; b < self->buckets_.size(); ++b) {
    const auto& bucket = self->buckets_[b];
    self->flat_.push_back(torch::zeros({bucket.padded}, f32));
    // The bucket is where the optimiser accumulates these gradients from now on: one float32
    // copy of the gradients, not an accumulation buffer and a bucket to copy it into. Placed
    // bucket by bucket, so that the optimiser's buffers go while the buckets come.
    for (std::size_t k = 0; k < bucket.params.size(); ++k) {
      const auto i = bucket.params[k];
      self->slot_[i] = {b, bucket.offsets[k]};
      optimizer.place_gradient(i, self->flat_[b].narrow(0, bucket.offsets[k], params[i].param.numel()));
    }
  }
  self->works_.resize(self->buckets_.size());
  self->reset_round();

  if (options.zero1) {
    self->param_dtype_ = dtype;
    const int r = c.rank();
    for (std::size_t b = 0; b < self->buckets_.size(); ++b) {
      const auto& bucket = self->buckets_[b];
      const auto chunk = bucket.chunk(c.size());
      const auto begin = chunk * r, end = begin + chunk;
      // This rank's masters: its chunk of the bucket's flattened float32 parameters.
      auto master = torch::zeros({chunk}, f32);
      std::vector<shard_segment> segs;
      for (std::size_t k = 0; k < bucket.params.size(); ++k) {
        const auto i = bucket.params[k];
        const auto off = bucket.offsets[k], len = params[i].param.numel();
        const auto lo_e = std::max(off, begin), hi_e = std::min(off + len, end);
        if (lo_e >= hi_e)
          continue;
        master.narrow(0, lo_e - begin, hi_e - lo_e)
          .copy_(params[i].param.detach().reshape(-1).narrow(0, lo_e - off, hi_e - lo_e));
        segs.push_back({i, lo_e - begin, hi_e - lo_e, params[i].param.dim() >= 2});
      }
      self->master_.push_back(master);
      self->exp_avg_.push_back(torch::zeros({chunk}, f32));
      self->exp_avg_sq_.push_back(torch::zeros({chunk}, f32));
      // The reduce-scatter runs in place: rank r's reduced chunk lands where its own chunk of the
      // bucket was (NCCL's in-place form, recvbuff = sendbuff + r * chunk), so the shard takes no
      // memory of its own.
      self->grad_shard_.push_back(self->flat_[b].narrow(0, begin, chunk));
      self->segments_.push_back(std::move(segs));
    }
  }

  auto* raw = self.get();
  for (std::size_t i = 0; i < params.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(params[i].param, std::make_unique<gradient_hook_impl>(raw, i));
  return self;
}

void data_parallel::reset_round() {
  armed_ = false;
  filled_.assign(optimizer_.parameters().size(), false);
  pending_.clear();
  for (const auto& b : buckets_)
    pending_.push_back(b.params.size());
  next_ = 0;
  errors_.clear();
  duplicate_.clear();
}

void data_parallel::begin_backward(bool last_micro_batch) noexcept { armed_ = options_.overlap && last_micro_batch; }

void data_parallel::on_gradient(std::size_t index) {
  if (!armed_) {
    // An earlier micro-batch (or no overlap): the gradient goes into its bucket now, so that a
    // bf16 .grad lives only until its parameter's gradient is complete, not until the backward
    // ends (the bf16 gradients of every parameter at once). The bucket is not on the wire.
    optimizer_.accumulate_gradient(index);
    return;
  }
  if (filled_[index]) {
    // A parameter reached twice in one backward (a graph that calls its AccumulateGrad twice):
    // its bucket may be on the wire already, so the reduction would miss the second part.
    duplicate_ = optimizer_.parameters()[index].name;
    return;
  }
  fill(index);
  while (next_ < buckets_.size() && pending_[next_] == 0)
    issue(next_++);
}

void data_parallel::fill(std::size_t index) {
  // The parameter's float32 gradient is a view into its bucket: a float32 parameter's autograd
  // has accumulated into it in place already; a bf16 one's last .grad is added in now (and
  // released).
  optimizer_.accumulate_gradient(index);
  filled_[index] = true;
  --pending_[slot_[index].first];
}

void data_parallel::issue(std::size_t b) {
  auto w = options_.zero1 ? comm_->reduce_scatter(flat_[b], grad_shard_[b], reduce_op::sum)
                          : comm_->all_reduce(flat_[b], reduce_op::sum);
  if (w)
    works_[b] = *w;
  else
    errors_.push_back(w.error());
}

result<void> data_parallel::reduce_gradients() {
  torch::NoGradGuard no_grad;
  armed_ = false;
  stats_.issued_during_backward = static_cast<std::int64_t>(next_);
  // Buckets the hooks did not complete (no overlap, a parameter without gradient this round, a
  // rank with no micro-batch) go out now, still in plan order.
  for (; next_ < buckets_.size(); ++next_) {
    for (auto i : buckets_[next_].params)
      if (!filled_[i])
        fill(i);
    issue(next_);
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<crucible::error> errors = errors_;
  for (auto& w : works_)
    if (auto r = w.wait(); !r)
      errors.push_back(r.error());
  stats_.wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats_.buckets = static_cast<std::int64_t>(buckets_.size());
  const auto duplicate = duplicate_;
  reset_round();
  if (!errors.empty())
    return errors.front();
  if (!duplicate.empty())
    return fail(errc::invalid_arg, "data_parallel: parameter ", duplicate,
                " received its gradient twice in one backward pass; its reduced gradient would be incomplete");
  // The sums are in the buckets, which are the optimiser's gradients (or under ZeRO-1 hold this
  // rank's reduced chunk, grad_shard_): nothing to copy.
  return {};
}

void data_parallel::reset_moment_shards() {
  torch::NoGradGuard no_grad;
  for (auto& m : exp_avg_)
    m.zero_();
  for (auto& v : exp_avg_sq_)
    v.zero_();
}

result<double> data_parallel::sharded_step(double max_norm, double lr, const adamw_options& options) {
  assert(options_.zero1);
  torch::NoGradGuard no_grad;
  // The global norm from every rank's shard (padding is zero).
  std::vector<torch::Tensor> sq;
  for (const auto& g : grad_shard_)
    sq.push_back(g.pow(2).sum());
  double total[1] = {torch::stack(sq).sum().item<double>()};
  if (auto r = all_reduce(total, reduce_op::sum); !r)
    return r.error();
  const double norm = std::sqrt(total[0]);
  const bool finite = std::isfinite(norm);
  if (!finite)
    return norm;
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (auto& g : grad_shard_)
      g.mul_(scale);
  }
  optimizer_.count_step();
  const auto t = optimizer_.steps() - optimizer_.moments_since();
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (options.weight_decay != 0.0)
      for (const auto& s : segments_[b])
        if (s.decays)
          master_[b].narrow(0, s.offset, s.length).mul_(1.0 - lr * options.weight_decay);
    adamw_update(master_[b], grad_shard_[b], exp_avg_[b], exp_avg_sq_[b], lr, t, options, /*decay=*/false);
  }
  if (auto r = gather_parameters(); !r)
    return r.error();
  return norm;
}

result<void> data_parallel::gather_parameters() {
  torch::NoGradGuard no_grad;
  const auto& params = optimizer_.parameters();
  const int n = comm_->size();
  const auto opts = torch::TensorOptions().dtype(param_dtype_).device(comm_->device());
  // Two buckets in flight: one on the wire while the previous one is copied into the parameters.
  struct in_flight {
    std::size_t bucket;
    torch::Tensor local, gathered;
    work w;
  };
  std::vector<in_flight> q;
  auto land = [&](in_flight& f) -> result<void> {
    if (auto r = f.w.wait(); !r)
      return r;
    const auto& bucket = buckets_[f.bucket];
    for (std::size_t k = 0; k < bucket.params.size(); ++k) {
      auto& p = params[bucket.params[k]].param;
      p.view(-1).copy_(f.gathered.narrow(0, bucket.offsets[k], p.numel()));
    }
    return {};
  };
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    in_flight f{b, master_[b].to(param_dtype_), torch::empty({buckets_[b].padded}, opts), {}};
    if (f.local.data_ptr() == master_[b].data_ptr())
      f.local = f.local.clone(); // float32 parameters: gather a copy, not the masters being read
    auto w = comm_->all_gather(f.local, f.gathered);
    if (!w)
      return w.error();
    f.w = *w;
    q.push_back(std::move(f));
    if (q.size() == 2) {
      if (auto r = land(q.front()); !r)
        return r;
      q.erase(q.begin());
    }
  }
  for (auto& f : q)
    if (auto r = land(f); !r)
      return r;
  (void) n;
  return {};
}

std::vector<std::pair<std::string, torch::Tensor>> data_parallel::shard_state() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  std::vector<std::int64_t> layout{comm_->size(), comm_->rank(), static_cast<std::int64_t>(buckets_.size())};
  for (const auto& b : buckets_)
    layout.push_back(b.padded);
  out.emplace_back("zero1.layout", torch::tensor(layout, torch::kLong));
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    out.emplace_back("zero1.master." + std::to_string(b), master_[b]);
    out.emplace_back("zero1.exp_avg." + std::to_string(b), exp_avg_[b]);
    out.emplace_back("zero1.exp_avg_sq." + std::to_string(b), exp_avg_sq_[b]);
  }
  return out;
}

result<void> data_parallel::restore_shard(const std::map<std::string, torch::Tensor>& tensors,
                                          const std::string& origin) {
  auto check = [&]() -> result<void> {
    auto it = tensors.find("zero1.layout");
    if (it == tensors.end() || it->second.scalar_type() != torch::kLong || it->second.dim() != 1 ||
        it->second.size(0) < 3)
      return fail(errc::corrupt, origin, ": missing or misshapen tensor zero1.layout");
    auto layout = it->second.cpu();
    auto a = layout.accessor<std::int64_t, 1>();
    if (a[0] != comm_->size() || a[1] != comm_->rank())
      return fail(errc::config, origin, ": a shard of rank ", str(a[1]), " of ", str(a[0]),
                  " ranks, restored on rank ", str(comm_->rank()), " of ", str(comm_->size()),
                  " (ZeRO-1 checkpoints resume on the same number of learners)");
    bool same = a[2] == static_cast<std::int64_t>(buckets_.size()) && layout.size(0) == 3 + a[2];
    for (std::size_t b = 0; same && b < buckets_.size(); ++b)
      same = a[3 + static_cast<std::int64_t>(b)] == buckets_[b].padded;
    if (!same)
      return fail(errc::config, origin,
                  ": the shard's gradient buckets differ from this learner's (learner.bucket_mb or the parameters "
                  "changed)");
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      for (const char* kind : {"zero1.master.", "zero1.exp_avg.", "zero1.exp_avg_sq."}) {
        const auto name = kind + std::to_string(b);
        auto t = tensors.find(name);
        if (t == tensors.end() || t->second.scalar_type() != torch::kFloat || t->second.sizes() != master_[b].sizes())
          return fail(errc::corrupt, origin, ": missing or misshapen tensor ", name);
      }
    return {};
  };
  // Every rank checks its shard before any changes, and all agree, so that none waits in the
  // all-gather for a rank that refused.
  auto mine = check();
  double refused[1] = {mine ? 0.0 : 1.0};
  if (auto r = all_reduce(refused, reduce_op::sum); !r)
    return r;
  if (!mine)
    return mine;
  if (refused[0] > 0)
    return fail(errc::corrupt, origin, ": ", std::to_string(static_cast<long long>(refused[0])),
                " other rank(s) refused their ZeRO-1 shard; nothing restored");
  torch::NoGradGuard no_grad;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    master_[b].copy_(tensors.at("zero1.master." + std::to_string(b)));
    exp_avg_[b].copy_(tensors.at("zero1.exp_avg." + std::to_string(b)));
    exp_avg_sq_[b].copy_(tensors.at("zero1.exp_avg_sq." + std::to_string(b)));
  }
  return gather_parameters();
}

} // namespace crucible::policy
