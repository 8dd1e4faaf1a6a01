// policy/distributed/data_parallel.hpp: one learner's side of data-parallel training. The
// optimiser's float32 gradients live in buckets (each parameter's a view into its bucket), each
// bucket reduced over the ranks in place as soon as the last micro-batch's backward completes it
// (so communication overlaps the rest of the backward pass); the optimiser then reads the reduced
// gradients where they are, or under ZeRO-1 each rank keeps only its shard of the reduced gradient,
// updates that shard's float32 masters and moments and all-gathers the new parameters.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "core/error.hpp"
#include "policy/distributed/collective.hpp"
#include "policy/training/optimizer.hpp"

namespace crucible::policy {

/// A run of parameters whose float32 gradients are reduced together.
struct gradient_bucket {
  std::vector<std::size_t> params;   ///< indices into the optimiser's parameters, in fill order
  std::vector<std::int64_t> offsets; ///< element offset of each in the flat bucket
  std::int64_t numel = 0;            ///< elements of the parameters
  std::int64_t padded = 0;           ///< numel rounded up to a multiple of the world size
  /// Elements of each rank's chunk under ZeRO-1 (padded / world size).
  std::int64_t chunk(int world_size) const { return padded / world_size; }
};

/// Buckets over parameters of `numels` elements. Parameters are taken from the last to the first
/// (the order in which a backward pass completes them: the output layers' gradients are ready
/// first); a bucket closes when the next parameter would take it past `bucket_bytes` of float32
/// gradient, and a parameter larger than that is a bucket of its own. Every parameter is in
/// exactly one bucket; a bucket's `padded` is a multiple of `world_size`. Pure function: every
/// rank computes the same plan.
std::vector<gradient_bucket> plan_gradient_buckets(std::span<const std::int64_t> numels, std::int64_t bucket_bytes,
                                                   int world_size);

/// How the gradients of a data-parallel learner are reduced. Plain value.
struct data_parallel_options {
  std::int64_t bucket_bytes = 25ll << 20; ///< float32 gradient bytes per bucket
  bool overlap = true;      ///< reduce each bucket when its gradients are complete (else after backward)
  bool zero1 = false;       ///< shard the optimiser state over the ranks (the adamw must be sharded)
  bool broadcast_initial = true; ///< start every rank from rank 0's parameters
};

/// What the last reduction did (for metrics and benchmarks). Plain value.
struct reduction_stats {
  std::int64_t buckets = 0;
  std::int64_t issued_during_backward = 0; ///< buckets whose collective started inside the backward pass
  double wait_seconds = 0.0;               ///< host time spent waiting for the reductions after backward
};

/// The data-parallel state of one learner (one rank). Holds the float32 gradients in flat buckets
/// and makes them the optimiser's (adamw::place_gradient: one float32 copy of the gradients, as
/// PyTorch DDP's gradient_as_bucket_view). Installs a post-accumulate-gradient hook on every
/// trainable parameter: each adds its parameter's gradient into its bucket as soon as autograd
/// has produced it (releasing a bf16 .grad at once), and while armed (the last micro-batch's
/// backward, with overlap) also issues each bucket its last gradient completes.
/// Owned by the learner's thread; the hooks run on autograd's threads while that thread waits in
/// backward(). Non-copyable.
class data_parallel final {
public:
  /// Checks with every rank that the parameters (names, shapes, dtypes), `identity` (e.g. the
  /// frozen base's digest), bucket size and ZeRO-1 setting agree (errc::config naming what
  /// differs), broadcasts rank 0's parameters when options.broadcast_initial, plans the buckets,
  /// places the optimiser's float32 gradients in them and, under ZeRO-1, takes this rank's shard
  /// of the float32 masters. Collective: every rank calls it. `optimizer` must outlive the result
  /// and be sharded exactly when options.zero1; its gradients stay in the buckets' storage.
  static result<std::unique_ptr<data_parallel>> create(std::shared_ptr<communicator> comm, adamw& optimizer,
                                                       const data_parallel_options& options,
                                                       const std::string& identity = {});
  ~data_parallel();
  data_parallel(const data_parallel&) = delete;
  data_parallel& operator=(const data_parallel&) = delete;

  /// Call before each micro-batch's backward: the hooks issue buckets only during the last one
  /// (gradients are reduced once per update, after accumulation).
  void begin_backward(bool last_micro_batch) noexcept;
  /// After the last backward: fills and issues the buckets not yet issued and waits for all of
  /// them. The optimiser's float32 gradients are views into the buckets (placed by create()), so
  /// unless ZeRO-1 they then hold the sum over the ranks of each gradient; under ZeRO-1 each
  /// rank's chunk of each bucket holds the sum over the ranks of that chunk (the rest of the
  /// bucket is this rank's own gradient and means nothing). Collective.
  result<void> reduce_gradients();
  /// ZeRO-1, after reduce_gradients: the global gradient norm over every rank's shard; when it is
  /// finite, clips the shard as clip_grad_norm would (max_norm > 0), applies AdamW at `lr` to this
  /// rank's masters and moments, counts the step in the optimiser and all-gathers the new
  /// parameters into the model. A non-finite norm changes nothing (on every rank alike).
  /// Collective.
  result<double> sharded_step(double max_norm, double lr, const adamw_options& options);
  /// ZeRO-1: zeroes this rank's moment shards (adamw::reset_moments restarts the bias correction).
  void reset_moment_shards();

  /// Element-wise sums or maxima of host numbers over the ranks (batch totals), in place.
  result<void> all_reduce(std::span<double> values, reduce_op op) { return all_reduce_host(*comm_, values, op); }

  communicator& comm() noexcept { return *comm_; }
  bool sharded() const noexcept { return options_.zero1; }
  const std::vector<gradient_bucket>& buckets() const noexcept { return buckets_; }
  /// The flat float32 bucket of each gradient_bucket ([padded]): the optimiser's gradients are
  /// views into them (the only float32 copy of the gradients this rank holds).
  const std::vector<torch::Tensor>& bucket_tensors() const noexcept { return flat_; }
  const reduction_stats& last_stats() const noexcept { return stats_; }

  /// ZeRO-1: this rank's optimiser state, "zero1.{master,exp_avg,exp_avg_sq}.B" for bucket B's
  /// chunk, plus "zero1.layout" (int64: world size, rank, bucket count, each bucket's padded size).
  std::vector<std::pair<std::string, torch::Tensor>> shard_state() const;
  /// Restores shard_state()'s tensors (layout checked first: errc::config when the world size,
  /// rank or buckets differ, errc::corrupt for a missing or misshapen tensor, naming `origin`),
  /// then all-gathers the parameters from the restored masters. Collective.
  result<void> restore_shard(const std::map<std::string, torch::Tensor>& tensors, const std::string& origin);

  /// Called by the hooks: parameter `index`'s gradient is complete for this backward.
  void on_gradient(std::size_t index);

private:
  data_parallel(std::shared_ptr<communicator> comm, adamw& optimizer, const data_parallel_options& options);
  void fill(std::size_t index);
  void issue(std::size_t bucket);
  result<void> gather_parameters();
  void reset_round();

  struct shard_segment {
    std::size_t param;     // optimiser index
    std::int64_t offset;   // in the chunk
    std::int64_t length;
    bool decays;
  };

  std::shared_ptr<communicator> comm_;
  adamw& optimizer_;
  data_parallel_options options_;
  std::vector<gradient_bucket> buckets_;
  std::vector<torch::Tensor> flat_;                   // per bucket: float32 [padded], the optimiser's gradients
  std::vector<std::pair<std::size_t, std::int64_t>> slot_; // per parameter: bucket, offset
  // This backward's progress (the hooks' state).
  bool armed_ = false;
  std::vector<bool> filled_;
  std::vector<std::size_t> pending_; // per bucket: parameters not yet filled
  std::size_t next_ = 0;             // the next bucket to issue: buckets go out in plan order on every rank
  std::vector<work> works_;
  std::vector<crucible::error> errors_;
  std::string duplicate_;            // a parameter whose gradient came twice in one backward
  reduction_stats stats_;
  // ZeRO-1: this rank's chunk of each bucket (grad_shard_: a view of it in flat_, where the
  // in-place reduce-scatter leaves the reduced chunk).
  std::vector<torch::Tensor> grad_shard_, master_, exp_avg_, exp_avg_sq_;
  std::vector<std::vector<shard_segment>> segments_;
  torch::ScalarType param_dtype_ = torch::kFloat;
};

} // namespace crucible::policy
