// storage/exemplar_select.hpp: exemplar selection for prompts: takes the replay store's variants of
// one (task, hardware kind) and returns the indices of the few shown to the policy as examples.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "storage/replay_store.hpp"

namespace crucible::storage {

/// How exemplars are drawn. `contrastive` is CUDA-L1's method; `random` and `island` are the
/// ablation baselines.
enum class selection_method : std::uint8_t {
  contrastive,  ///< score buckets drawn ∝ exp((bucket mean − global mean)/τ), one variant each
  random,       ///< n distinct successful variants, uniformly
  island,       ///< FunSearch-style: a uniform non-empty island, then contrastive within it
};

/// Options of select_exemplars(). Value type; check with validate().
struct exemplar_options {
  selection_method method = selection_method::contrastive;
  std::size_t n = 2;           ///< exemplars wanted (≥ 1); fewer come back when fewer exist
  double tau = 1.0;            ///< temperature of the bucket softmax (> 0)
  double bucket_width = 0.5;   ///< width of a score bucket, in the score's units (> 0)
  /// Score by the variant's fraction of its task's limit instead of its reward (exemplar.score).
  bool by_fraction = false;
  std::size_t islands = 4;     ///< island count for selection_method::island (≥ 1)
};

/// The selection part of the `exemplar:` config section as options of select_exemplars()
/// (the straggler fields belong to group assembly and are not carried). Values are copied as
/// they are; validate() still checks them.
exemplar_options to_exemplar_options(const exemplar_config& cfg) noexcept;

/// errc::config naming the first bad field ("exemplar.n", "exemplar.tau",
/// "exemplar.bucket_width", "exemplar.islands"); `islands` is checked only for the island method.
result<void> validate(const exemplar_options& opts);

/// A variant may be an exemplar: status "ok", correct, a speedup measured, and a finite reward.
bool is_successful(const variant_record& v) noexcept;

/// Chooses exemplars among `candidates`, which the caller has already filtered to one task and
/// one hardware kind. Unsuccessful candidates (see is_successful) are never chosen. The score of
/// a variant is its `reward` field, or with `by_fraction` its `fraction` (the successful ones
/// without a fraction are then left out, unless none has one: then the reward); its bucket is
/// floor(score / bucket_width).
///
/// contrastive: N distinct buckets are drawn without replacement, each draw over the remaining
/// buckets with probability ∝ exp((bucket mean − global mean)/τ), where the global mean is the
/// mean score over all successful candidates; then one variant uniformly within each bucket.
/// With fewer than N buckets every bucket is taken once (in drawn order).
/// random: min(N, successful) distinct successful variants, uniformly.
/// island: each successful variant goes to island FNV-1a-64(code_hash) mod `islands`; one
/// non-empty island is drawn uniformly and contrastive selection runs within it alone.
///
/// Returns distinct indices into `candidates`, in draw order; possibly fewer than N; empty when
/// nothing succeeded (prompt with the reference only). Deterministic for a given `rng` state and
/// standard library (the draws use only rng(), no std distributions). errc::config from
/// validate(). Pure apart from advancing `rng`; thread-safe for distinct `rng`s.
result<std::vector<std::size_t>> select_exemplars(std::span<const variant_record> candidates,
                                                  const exemplar_options& opts,
                                                  std::mt19937_64& rng);

} // namespace crucible::storage
