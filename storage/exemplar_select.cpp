// storage/exemplar_select.cpp: contrastive, random and island exemplar selection over replay-store
// variants; the prompt builder calls it with one task's variants and a seeded generator.
#include "storage/exemplar_select.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <string_view>

namespace crucible::storage {
namespace {

// Our own draws instead of std::uniform_*_distribution: those differ between standard
// libraries, and selection must replay from a seed.
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0, 1), 53 random bits
}

std::size_t uniform_index(std::mt19937_64& rng, std::size_t k) {
  // Rejection keeps it exactly uniform; k is small, so retries are rare.
  const std::uint64_t n = k;
  const std::uint64_t limit = UINT64_MAX - (UINT64_MAX % n);
  std::uint64_t x = rng();
  while (x >= limit) x = rng();
  return static_cast<std::size_t>(x % n);
}

std::uint64_t fnv1a64(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Contrastive selection over the successful candidates listed in `pool`.
std::vector<std::size_t> contrastive(std::span<const variant_record> cands,
                                     const std::vector<std::size_t>& pool,
                                     const exemplar_options& opts, std::mt19937_64& rng) {
  if (pool.empty()) return {};
  // The pool holds variants with a fraction only where `by_fraction` found any (select_exemplars).
  const bool fractions = opts.by_fraction && cands[pool.front()].fraction.has_value();
  auto score = [&](std::size_t i) { return fractions ? *cands[i].fraction : cands[i].reward; };
  // std::map: buckets in ascending score order, so draws do not depend on input order of keys.
  std::map<std::int64_t, std::vector<std::size_t>> by_bucket;
  double total = 0.0;
  for (std::size_t i : pool) {
    const double s = score(i);
    total += s;
    by_bucket[static_cast<std::int64_t>(std::floor(s / opts.bucket_width))].push_back(i);
  }
  const double global_mean = total / static_cast<double>(pool.size());

  struct bucket {
    std::vector<std::size_t> members;
    double logit;
  };
  std::vector<bucket> buckets;
  for (auto& [key, members] : by_bucket) {
    double sum = 0.0;
    for (std::size_t i : members) sum += score(i);
    const double mean = sum / static_cast<double>(members.size());
    buckets.push_back({std::move(members), (mean - global_mean) / opts.tau});
  }

  std::vector<std::size_t> out;
  while (out.size() < opts.n && !buckets.empty()) {
    // Subtract the largest logit so exp() cannot overflow; the ratios are unchanged.
    double max_logit = buckets.front().logit;
    for (const auto& b : buckets) max_logit = std::max(max_logit, b.logit);
    std::vector<double> w(buckets.size());
    double sum = 0.0;
    for (std::size_t b = 0; b < buckets.size(); ++b) sum += w[b] = std::exp(buckets[b].logit - max_logit);
    double u = uniform01(rng) * sum;
    std::size_t pick = buckets.size() - 1;  // fallback for rounding at the top end
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      if (u < w[b]) {
        pick = b;
        break;
      }
      u -= w[b];
    }
    const auto& members = buckets[pick].members;
    out.push_back(members[uniform_index(rng, members.size())]);
    buckets.erase(buckets.begin() + static_cast<std::ptrdiff_t>(pick));
  }
  return out;
}

} // namespace

exemplar_options to_exemplar_options(const exemplar_config& cfg) noexcept {
  exemplar_options o;
  switch (cfg.method) {
    case exemplar_method::contrastive: o.method = selection_method::contrastive; break;
    case exemplar_method::random: o.method = selection_method::random; break;
    case exemplar_method::island: o.method = selection_method::island; break;
  }
  // The config's integers are validated positive; a negative one (a caller that skipped
  // parse_config) becomes 0 and is refused by validate().
  o.n = cfg.n > 0 ? static_cast<std::size_t>(cfg.n) : 0;
  o.tau = cfg.tau;
  o.bucket_width = cfg.bucket_width;
  o.by_fraction = cfg.score == exemplar_score::fraction;
  o.islands = cfg.islands > 0 ? static_cast<std::size_t>(cfg.islands) : 0;
  return o;
}

result<void> validate(const exemplar_options& opts) {
  if (opts.n < 1) return fail(errc::config, "exemplar.n: must be at least 1");
  if (!(opts.tau > 0.0) || !std::isfinite(opts.tau))
    return fail(errc::config, "exemplar.tau: must be a finite number > 0");
  if (!(opts.bucket_width > 0.0) || !std::isfinite(opts.bucket_width))
    return fail(errc::config, "exemplar.bucket_width: must be a finite number > 0");
  if (opts.method == selection_method::island && opts.islands < 1)
    return fail(errc::config, "exemplar.islands: must be at least 1");
  return {};
}

bool is_successful(const variant_record& v) noexcept {
  return v.status == "ok" && v.correct && v.speedup.has_value() && std::isfinite(v.reward);
}

result<std::vector<std::size_t>> select_exemplars(std::span<const variant_record> candidates,
                                                  const exemplar_options& opts,
                                                  std::mt19937_64& rng) {
  if (auto ok = validate(opts); !ok) return ok.error();
  std::vector<std::size_t> pool;
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (is_successful(candidates[i])) pool.push_back(i);
  if (opts.by_fraction) {
    // Scored by the fraction of the limit: those whose verdict carried none are left out, unless
    // none of the task's has one (then the reward decides, as without by_fraction).
    auto has = [&](std::size_t i) { return candidates[i].fraction && std::isfinite(*candidates[i].fraction); };
    if (std::any_of(pool.begin(), pool.end(), has))
      std::erase_if(pool, [&](std::size_t i) { return !has(i); });
  }

  switch (opts.method) {
  case selection_method::contrastive:
    return contrastive(candidates, pool, opts, rng);
  case selection_method::random: {
    // Partial Fisher-Yates: the first k slots are a uniform k-subset in uniform order.
    const std::size_t k = std::min(opts.n, pool.size());
    for (std::size_t j = 0; j < k; ++j)
      std::swap(pool[j], pool[j + uniform_index(rng, pool.size() - j)]);
    pool.resize(k);
    return pool;
  }
  case selection_method::island: {
    std::map<std::uint64_t, std::vector<std::size_t>> by_island;
    for (std::size_t i : pool) by_island[fnv1a64(candidates[i].code_hash) % opts.islands].push_back(i);
    if (by_island.empty()) return std::vector<std::size_t>{};
    auto it = by_island.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(uniform_index(rng, by_island.size())));
    return contrastive(candidates, it->second, opts, rng);
  }
  }
  return std::vector<std::size_t>{};
}

} // namespace crucible::storage
