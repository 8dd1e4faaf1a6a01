// The work division of the decode attention kernel (policy/kernels/attention_plan.hpp) on the host:
// every visible slot read exactly once and nothing past it, every element of a row owned by
// exactly one lane of a key's lanes, the register capacity never exceeded, the split choice;
// then the kernel's arithmetic replayed lane group by lane group through the same functions
// (online softmax per warp round, warp merge, block merge, combine of splits) against a float64
// softmax, for the edge cases of lengths and splits. The kernel itself runs in
// tests/gpu/test_gpu_kernels.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "policy/kernels/attention_plan.hpp"

using namespace crucible::policy::kernels;

namespace {

constexpr float log2_e = 1.4426950408889634f;
constexpr float neg_inf = -std::numeric_limits<float>::infinity();

struct shape {
  int heads, kv_heads, head_dim;
};

// Shapes of the edge cases: Qwen2.5-0.5B's (group 7, head_dim 64), no GQA at 128, group 8 (two
// blocks of four heads), group 3 with a head_dim not a multiple of 8 (element loads), group 12
// at 256, the smallest head_dim.
const shape shapes[] = {{14, 2, 64}, {4, 4, 128}, {8, 1, 64}, {6, 2, 40}, {24, 2, 256}, {3, 1, 2}, {2, 1, 96}};

std::string describe(int bytes, bool aligned, const shape& s) {
  return std::to_string(bytes) + "-byte " + (aligned ? "aligned" : "unaligned") + " heads " + std::to_string(s.heads) +
         "/" + std::to_string(s.kv_heads) + " dim " + std::to_string(s.head_dim);
}

// Lengths around the edges for a cache of `slots`: none visible (-1), one, granule boundaries,
// all, and past the end (clamped).
std::vector<std::int64_t> edge_lengths(std::int64_t slots, std::int64_t granule) {
  std::vector<std::int64_t> out{-1, 0, 1, granule - 2, granule - 1, granule, slots - 2, slots - 1, slots + 5};
  out.erase(std::remove_if(out.begin(), out.end(), [](std::int64_t l) { return l < -1; }), out.end());
  return out;
}

} // namespace

TEST_CASE("the attention plan gives every element of a row to one lane of each key and fits the registers") {
  for (int bytes : {4, 2}) {
    for (bool aligned : {true, false}) {
      for (int group = 1; group <= 16; ++group) {
        for (int dim = 2; dim <= decode_attention_max_head_dim; dim += 2) {
          const auto p = plan_decode_attention(bytes, aligned, group, dim);
          CAPTURE(describe(bytes, aligned, shape{group, 1, dim}));
          REQUIRE(dim % p.vec == 0);
          CHECK((p.vec == 1 || p.vec * bytes == 16));
          CHECK((p.vec > 1 || !aligned || dim % (16 / bytes) != 0)); // aligned data loads 16 bytes when it can
          CHECK((p.lanes_per_key & (p.lanes_per_key - 1)) == 0);
          CHECK(p.lanes_per_key * p.keys_per_step == 32);
          CHECK(p.vectors_per_lane <= decode_attention_lane_vectors(p.vec));
          CHECK(p.warp_tile == p.keys_per_step * decode_attention_steps);
          CHECK(p.granule == decode_attention_warps * p.warp_tile);
          CHECK(p.heads_per_block <= decode_attention_max_heads_per_block);
          CHECK(p.head_blocks * p.heads_per_block >= group);
          CHECK((p.head_blocks - 1) * p.heads_per_block < group); // no block without a head
          // Each key's lane group: lanes [k * L, (k + 1) * L) with loads i below the kernel's capacity.
          for (int key = 0; key < p.keys_per_step; ++key) {
            std::vector<int> owners(static_cast<std::size_t>(dim), 0);
            for (int lane = key * p.lanes_per_key; lane < (key + 1) * p.lanes_per_key; ++lane) {
              CHECK(decode_attention_lane_slot(p, 100, 1, lane) == 100 + p.keys_per_step + key);
              for (int i = 0; i < decode_attention_lane_vectors(p.vec); ++i) {
                const int e = decode_attention_lane_element(p, lane, i);
                REQUIRE(e >= 0);
                if (e >= dim)
                  continue;
                REQUIRE(e + p.vec <= dim); // a load never runs past the row
                for (int c = 0; c < p.vec; ++c)
                  ++owners[static_cast<std::size_t>(e + c)];
              }
            }
            CHECK(std::count(owners.begin(), owners.end(), 1) == dim);
          }
        }
      }
    }
  }
}

TEST_CASE("the blocks, warps and lanes of a launch read each visible slot once and no other") {
  for (int bytes : {4, 2}) {
    for (bool aligned : {true, false}) {
      for (const auto& s : shapes) {
        const auto p = plan_decode_attention(bytes, aligned, s.heads / s.kv_heads, s.head_dim);
        for (std::int64_t slots : {1, 7, 33, 100, 300, 1024, 1280}) {
          for (std::int64_t rows : {1, 16, 64}) {
            for (std::int64_t requested : {0, 1, 3, 1000}) {
              const auto split = choose_decode_attention_split(p, rows, s.kv_heads, slots, 132, requested);
              CAPTURE(describe(bytes, aligned, s));
              CAPTURE(slots);
              CAPTURE(rows);
              CAPTURE(requested);
              REQUIRE(split.chunk > 0);
              REQUIRE(split.chunk % p.granule == 0);
              REQUIRE(split.chunk % decode_attention_warps == 0);
              CHECK(split.splits >= 1);
              CHECK(split.splits * split.chunk >= slots);       // every slot in some split
              CHECK((split.splits - 1) * split.chunk < slots);  // no split wholly past the cache
              CHECK(split.splits <= std::max<std::int64_t>(requested, 64));
              if (requested == 1)
                CHECK(split.splits == 1);
              for (std::int64_t length : edge_lengths(slots, p.granule)) {
                const std::int64_t n = decode_attention_visible(length, slots);
                CHECK(n == std::clamp<std::int64_t>(length + 1, 0, slots));
                std::vector<int> reads(static_cast<std::size_t>(slots), 0);
                std::int64_t working = 0;
                for (std::int64_t b = 0; b < split.splits; ++b) {
                  if (b * split.chunk >= n)
                    continue; // the block returns at once
                  ++working;
                  for (int w = 0; w < decode_attention_warps; ++w) {
                    const auto run = decode_attention_warp_slots(n, split.chunk, b, w);
                    CHECK(run.begin <= run.end);
                    CHECK(run.begin >= b * split.chunk);
                    CHECK((run.end == run.begin || run.end <= std::min(n, (b + 1) * split.chunk)));
                    if (w == 0)
                      CHECK(run.end > run.begin); // a working block's first warp has a slot: a finite max
                    for (std::int64_t round = run.begin; round < run.end; round += p.warp_tile) {
                      CHECK(decode_attention_lane_slot(p, round, 0, 0) < run.end); // each round has a valid slot
                      for (int u = 0; u < decode_attention_steps; ++u)
                        for (int lane = 0; lane < 32; lane += p.lanes_per_key) { // one lane per key
                          const auto slot = decode_attention_lane_slot(p, round, u, lane);
                          REQUIRE(slot >= run.begin);
                          if (slot < run.end)
                            ++reads[static_cast<std::size_t>(slot)];
                        }
                    }
                  }
                }
                CHECK(working == decode_attention_used_splits(n, split.chunk));
                CHECK(working <= split.splits);
                for (std::int64_t i = 0; i < slots; ++i)
                  REQUIRE_MESSAGE(reads[static_cast<std::size_t>(i)] == (i < n ? 1 : 0), "slot " << i << " of " << n);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("the split choice: about eight blocks an SM, at most 64 splits, fixed by the shape") {
  const auto p = plan_decode_attention(2, true, 7, 64); // Qwen2.5-0.5B in bf16
  CHECK(p.vec == 8);
  CHECK(p.lanes_per_key == 8);
  CHECK(p.keys_per_step == 4);
  CHECK(p.heads_per_block == 4);
  CHECK(p.head_blocks == 2);
  CHECK(p.granule == 32);
  // Batch 1 on 132 SMs: 1 * 2 * 2 blocks a split want 264 splits, capped at 64, then at the 32
  // granules of 1024 slots: one granule a split.
  auto s = choose_decode_attention_split(p, 1, 2, 1024, 132, 0);
  CHECK(s.splits == 32);
  CHECK(s.chunk == 32);
  // Batch 16: 64 blocks a split want 17 splits: chunks of 2 granules, 16 splits.
  s = choose_decode_attention_split(p, 16, 2, 1024, 132, 0);
  CHECK(s.chunk == 64);
  CHECK(s.splits == 16);
  // Batch 64: 256 blocks a split want 5 splits: chunks of 7 granules, 5 splits (the last short).
  s = choose_decode_attention_split(p, 64, 2, 1024, 132, 0);
  CHECK(s.chunk == 224);
  CHECK(s.splits == 5);
  // A single slot: one split of one granule.
  s = choose_decode_attention_split(p, 1, 2, 1, 132, 0);
  CHECK(s.splits == 1);
  CHECK(s.chunk == 32);
}

TEST_CASE("a wide launch: one block per query head, its warps cover the visible slots once, in order") {
  for (int bytes : {4, 2}) {
    for (const auto& s : shapes) {
      const int group = s.heads / s.kv_heads;
      const auto narrow = plan_decode_attention(bytes, true, group, s.head_dim);
      const auto p = plan_decode_attention_wide(bytes, true, group, s.head_dim);
      CAPTURE(describe(bytes, true, s));
      CHECK(p.vec == narrow.vec);
      CHECK(p.lanes_per_key == narrow.lanes_per_key);
      CHECK(p.heads_per_block == 1);
      CHECK(p.head_blocks == group);
      CHECK(p.warps == decode_attention_wide_warps);
      CHECK(p.warp_tile == p.keys_per_step * p.steps);
      CHECK(p.granule == p.warps * p.warp_tile);
      if (p.vec > 1) // the loads of a round: at most 8 of 16 bytes a lane for keys and as many for values
        CHECK(p.steps * decode_attention_lane_vectors(p.vec) <= 8);
      CHECK(plan_decode_attention_wide(bytes, false, group, s.head_dim).vec == 1); // unaligned: never wide
      for (std::int64_t length : {-1LL, 0LL, 1LL, 14LL, 15LL, 16LL, 17LL, 31LL, 100LL, 511LL, 512LL, 513LL, 1023LL, 1030LL}) {
        const std::int64_t slots = 1024, n = decode_attention_visible(length, slots);
        CAPTURE(length);
        std::vector<int> reads(static_cast<std::size_t>(slots), 0);
        std::int64_t previous_end = 0, rounds = 0;
        for (int w = 0; w < p.warps; ++w) {
          const auto run = decode_attention_even_slots(n, p.warps, w);
          CHECK(run.begin <= run.end);
          CHECK(run.begin == previous_end); // contiguous, in warp order
          previous_end = run.end;
          if (w == 0 && n > 0)
            CHECK(run.end > run.begin); // warp 0 has a slot: the block's max is finite
          std::int64_t warp_rounds = 0;
          for (std::int64_t round = run.begin; round < run.end; round += p.warp_tile, ++warp_rounds)
            for (int u = 0; u < p.steps; ++u)
              for (int lane = 0; lane < 32; lane += p.lanes_per_key) {
                const auto slot = decode_attention_lane_slot(p, round, u, lane);
                REQUIRE(slot >= run.begin);
                if (slot < run.end)
                  ++reads[static_cast<std::size_t>(slot)];
              }
          rounds = std::max(rounds, warp_rounds);
        }
        CHECK(previous_end == std::max<std::int64_t>(n, 0));
        for (std::int64_t i = 0; i < slots; ++i)
          REQUIRE_MESSAGE(reads[static_cast<std::size_t>(i)] == (i < n ? 1 : 0), "slot " << i << " of " << n);
        // The even cut takes no more rounds than the fewest any cut of n slots over the warps can.
        CHECK(rounds == (n + p.granule - 1) / p.granule);
      }
    }
  }
}

TEST_CASE("the wide choice: 16-byte loads, blocks on at most half the SMs, at most four rounds a warp") {
  const auto p = plan_decode_attention_wide(2, true, 7, 64); // Qwen2.5-0.5B in bf16
  CHECK(p.steps == 8);
  CHECK(p.warp_tile == 32);
  CHECK(p.granule == 512);
  CHECK(decode_attention_wide_suits(p, 1, 14, 1024, 132));  // batch 1, 512 + 512 tokens: 14 blocks, 2 rounds
  CHECK(decode_attention_wide_suits(p, 4, 14, 2048, 132));  // 56 blocks, 4 rounds
  CHECK_FALSE(decode_attention_wide_suits(p, 5, 14, 1024, 132)); // 70 blocks: more than half of 132
  CHECK_FALSE(decode_attention_wide_suits(p, 1, 14, 2049, 132)); // five rounds
  CHECK_FALSE(decode_attention_wide_suits(plan_decode_attention_wide(2, false, 7, 64), 1, 14, 1024, 132));
  const auto f = plan_decode_attention_wide(4, true, 7, 64); // float32: half the steps, the same registers
  CHECK(f.steps == 4);
  CHECK(f.warp_tile == 8);
  CHECK(decode_attention_wide_suits(f, 1, 14, 512, 132));
  CHECK_FALSE(decode_attention_wide_suits(f, 1, 14, 1024, 132));
}

TEST_CASE("the merge's split: blocks on at most half the SMs, 2 to 8 splits of whole key steps, each with slots") {
  const auto p = plan_decode_attention_wide(2, true, 7, 64); // Qwen2.5-0.5B in bf16: steps of 64 slots
  const auto s = choose_decode_attention_merge_split(p, 1, 14, 1024, 132);
  CHECK(s.splits == 4); // 66 / 14
  CHECK(s.chunk == 256);
  CHECK(choose_decode_attention_merge_split(p, 1, 14, 1000, 132).chunk == 256); // 16 steps over 4
  CHECK(choose_decode_attention_merge_split(p, 1, 14, 129, 132).splits == 3);   // 3 steps: 3 splits of one
  CHECK(choose_decode_attention_merge_split(p, 1, 14, 64, 132).splits == 0);    // one step: not split
  CHECK(choose_decode_attention_merge_split(p, 1, 32, 1024, 132).splits == 2);
  CHECK(choose_decode_attention_merge_split(p, 1, 40, 1024, 132).splits == 0);  // 66 / 40: one split
  CHECK(choose_decode_attention_merge_split(p, 1, 2, 8192, 132).splits == 8);   // at most 8
  CHECK(choose_decode_attention_merge_split(p, 1, 14, 8192, 132).chunk == 2048); // four rounds a warp
  CHECK(choose_decode_attention_merge_split(p, 1, 14, 8193, 132).splits == 0);  // chunks of 2112: more
  CHECK(choose_decode_attention_merge_split(plan_decode_attention_wide(2, false, 7, 64), 1, 14, 1024, 132).splits == 0);
  const auto half = plan_decode_attention_wide(2, true, 7, 64, decode_attention_half_wide_warps);
  CHECK(half.granule == 256); // a round of eight warps
  const auto h = choose_decode_attention_merge_split(half, 1, 14, 1024, 132);
  CHECK(h.splits == 4);
  CHECK(h.chunk == 256); // one whole round a warp
  CHECK(choose_decode_attention_merge_split(half, 1, 14, 4096, 132).chunk == 1024);
  CHECK(choose_decode_attention_merge_split(half, 1, 14, 4097, 132).splits == 0); // five rounds
  for (std::int64_t slots : {65LL, 100LL, 256LL, 777LL, 1024LL, 2048LL}) {
    for (std::int64_t heads : {2LL, 7LL, 14LL, 28LL}) {
      const auto m = choose_decode_attention_merge_split(p, 1, heads, slots, 132);
      CAPTURE(slots);
      CAPTURE(heads);
      if (m.splits == 0)
        continue;
      CHECK(m.splits >= 2);
      CHECK(m.splits <= decode_attention_merge_max_splits);
      CHECK(heads * m.splits <= 66);
      CHECK(m.chunk % (p.warps * p.keys_per_step) == 0);
      CHECK(m.chunk % decode_attention_warps == 0); // what decode_attention takes
      CHECK(m.chunk * m.splits >= slots);
      CHECK((m.splits - 1) * m.chunk < slots); // the last split holds slots
      CHECK(m.chunk <= decode_attention_wide_rounds * p.granule);
    }
  }
}

TEST_CASE("a wide launch in splits: each split's warps cover its visible slots once, in order") {
  const auto p = plan_decode_attention_wide(2, true, 7, 64);
  for (std::int64_t chunk : {64LL, 256LL, 320LL}) {
    for (std::int64_t length : {-1LL, 0LL, 1LL, 63LL, 64LL, 255LL, 256LL, 700LL, 1023LL}) {
      const std::int64_t slots = 1024, n = decode_attention_visible(length, slots);
      const std::int64_t splits = (slots + chunk - 1) / chunk;
      CAPTURE(chunk);
      CAPTURE(length);
      std::vector<int> reads(static_cast<std::size_t>(slots), 0);
      std::int64_t used = 0;
      for (std::int64_t split = 0; split < splits; ++split) {
        const bool holds = split * chunk < n; // what the kernel tests before any read
        used += holds ? 1 : 0;
        std::int64_t previous_end = split * chunk;
        for (int w = 0; w < p.warps; ++w) {
          const auto run = decode_attention_wide_slots(n, chunk, split, p.warps, w);
          CHECK(run.begin <= run.end);
          CHECK(run.begin == previous_end);
          previous_end = run.end;
          if (w == 0 && holds)
            CHECK(run.end > run.begin); // the block's max is finite
          for (auto slot = run.begin; slot < run.end; ++slot)
            if (holds)
              ++reads[static_cast<std::size_t>(slot)];
        }
        CHECK(previous_end == std::max(split * chunk, std::min(n, (split + 1) * chunk)));
      }
      CHECK(used == decode_attention_used_splits(n, chunk));
      for (std::int64_t i = 0; i < slots; ++i)
        REQUIRE_MESSAGE(reads[static_cast<std::size_t>(i)] == (i < n ? 1 : 0), "slot " << i << " of " << n);
      // One split over the whole row is the wide launch of old.
      for (int w = 0; w < p.warps; ++w) {
        const auto one = decode_attention_wide_slots(n, 1024, 0, p.warps, w), even = decode_attention_even_slots(n, p.warps, w);
        CHECK(one.begin == even.begin);
        CHECK(one.end == even.end);
      }
    }
  }
}

namespace {

// The kernel's arithmetic for one row on the host, in float32: the same plan, splits, warp
// ranges, rounds, lane slots and lane elements; the sums over a key's lanes and over key groups
// are taken in another order than the shuffles take them (float32 rounding only).
struct row_inputs {
  int heads, kv_heads, dim;
  std::int64_t slots;
  std::vector<float> q;    // [heads][dim]
  std::vector<float> k, v; // [kv_heads][slots][dim]
  float key(int h, std::int64_t s, int e) const { return k[(static_cast<std::size_t>(h) * slots + s) * dim + e]; }
  float value(int h, std::int64_t s, int e) const { return v[(static_cast<std::size_t>(h) * slots + s) * dim + e]; }
};

std::vector<float> emulate_row(const decode_attention_plan& p, const decode_attention_split& split, const row_inputs& in,
                               std::int64_t length) {
  const int d = in.dim, group = in.heads / in.kv_heads, gm = p.heads_per_block;
  const int key_groups = p.keys_per_step;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d)) * log2_e;
  const std::int64_t n = decode_attention_visible(length, in.slots);
  std::vector<float> out(static_cast<std::size_t>(in.heads) * d, std::nanf(""));
  // Partials of the splits, as partial_out and partial_ml hold them: [head][split][dim], [head][split][2].
  std::vector<float> partial_out(static_cast<std::size_t>(in.heads) * split.splits * d, std::nanf(""));
  std::vector<float> partial_ml(static_cast<std::size_t>(in.heads) * split.splits * 2, std::nanf(""));
  for (int kv = 0; kv < in.kv_heads; ++kv) {
    for (int hb = 0; hb < p.head_blocks; ++hb) {
      const int g0 = hb * gm, gn = std::min(gm, group - g0);
      const int first_head = kv * group + g0;
      for (std::int64_t b = 0; b < split.splits; ++b) {
        if (b * split.chunk >= n) {
          if (split.splits == 1)
            std::fill(out.begin() + static_cast<std::ptrdiff_t>(first_head) * d,
                      out.begin() + static_cast<std::ptrdiff_t>(first_head + gn) * d, 0.0f);
          continue;
        }
        // Per warp: max (shared by its lanes), and per key group the sums of weights and values.
        std::vector<float> warp_m(decode_attention_warps * gm), warp_l(decode_attention_warps * gm),
          warp_acc(static_cast<std::size_t>(decode_attention_warps) * gm * d);
        for (int w = 0; w < decode_attention_warps; ++w) {
          std::vector<float> m(gm, neg_inf), l(static_cast<std::size_t>(key_groups) * gm, 0.0f),
            acc(static_cast<std::size_t>(key_groups) * gm * d, 0.0f);
          const auto run = decode_attention_warp_slots(n, split.chunk, b, w);
          for (std::int64_t round = run.begin; round < run.end; round += p.warp_tile) {
            // Scores [step][key group][head], -inf for slots past the warp's range.
            std::vector<float> s(static_cast<std::size_t>(decode_attention_steps) * key_groups * gm, neg_inf);
            auto at = [&](int u, int kg, int g) -> float& {
              return s[(static_cast<std::size_t>(u) * key_groups + kg) * gm + g];
            };
            for (int u = 0; u < decode_attention_steps; ++u)
              for (int kg = 0; kg < key_groups; ++kg) {
                const auto slot = decode_attention_lane_slot(p, round, u, kg * p.lanes_per_key);
                if (slot >= run.end)
                  continue;
                for (int g = 0; g < gm; ++g) {
                  float dot = 0.0f;
                  for (int lane = kg * p.lanes_per_key; lane < (kg + 1) * p.lanes_per_key; ++lane)
                    for (int i = 0; i < decode_attention_lane_vectors(p.vec); ++i) {
                      const int e0 = decode_attention_lane_element(p, lane, i);
                      for (int c = 0; c < p.vec && e0 < d && g < gn; ++c)
                        dot += in.q[static_cast<std::size_t>(first_head + g) * d + e0 + c] * scale *
                               in.key(kv, slot, e0 + c);
                    }
                  at(u, kg, g) = dot;
                }
              }
            for (int g = 0; g < gm; ++g) {
              float round_max = neg_inf;
              for (int u = 0; u < decode_attention_steps; ++u)
                for (int kg = 0; kg < key_groups; ++kg)
                  round_max = std::max(round_max, at(u, kg, g));
              REQUIRE(std::isfinite(round_max));
              const float m_new = std::max(m[g], round_max);
              const float alpha = std::exp2(m[g] - m_new);
              REQUIRE(!std::isnan(alpha));
              m[g] = m_new;
              for (int kg = 0; kg < key_groups; ++kg) {
                l[kg * gm + g] *= alpha;
                for (int e = 0; e < d; ++e)
                  acc[(static_cast<std::size_t>(kg) * gm + g) * d + e] *= alpha;
              }
              for (int u = 0; u < decode_attention_steps; ++u)
                for (int kg = 0; kg < key_groups; ++kg) {
                  const float weight = std::exp2(at(u, kg, g) - m_new);
                  l[kg * gm + g] += weight;
                  const auto slot = decode_attention_lane_slot(p, round, u, kg * p.lanes_per_key);
                  if (weight == 0.0f)
                    continue; // a slot past the range: the kernel multiplies zeros
                  for (int lane = kg * p.lanes_per_key; lane < (kg + 1) * p.lanes_per_key; ++lane)
                    for (int i = 0; i < decode_attention_lane_vectors(p.vec); ++i) {
                      const int e0 = decode_attention_lane_element(p, lane, i);
                      for (int c = 0; c < p.vec && e0 < d; ++c)
                        acc[(static_cast<std::size_t>(kg) * gm + g) * d + e0 + c] += weight * in.value(kv, slot, e0 + c);
                    }
                }
            }
          }
          for (int g = 0; g < gm; ++g) { // the warp merge over key groups
            warp_m[w * gm + g] = m[g];
            float sum_l = 0.0f;
            for (int kg = 0; kg < key_groups; ++kg)
              sum_l += l[kg * gm + g];
            warp_l[w * gm + g] = sum_l;
            for (int e = 0; e < d; ++e) {
              float sum = 0.0f;
              for (int kg = 0; kg < key_groups; ++kg)
                sum += acc[(static_cast<std::size_t>(kg) * gm + g) * d + e];
              warp_acc[(static_cast<std::size_t>(w) * gm + g) * d + e] = sum;
            }
          }
        }
        for (int g = 0; g < gn; ++g) { // the block merge
          float mx = neg_inf;
          for (int w = 0; w < decode_attention_warps; ++w)
            mx = std::max(mx, warp_m[w * gm + g]);
          REQUIRE(std::isfinite(mx));
          float weight = 0.0f;
          std::vector<float> sum(static_cast<std::size_t>(d), 0.0f);
          for (int w = 0; w < decode_attention_warps; ++w) {
            if (warp_m[w * gm + g] == neg_inf)
              continue;
            const float f = std::exp2(warp_m[w * gm + g] - mx);
            weight += f * warp_l[w * gm + g];
            for (int e = 0; e < d; ++e)
              sum[e] += f * warp_acc[(static_cast<std::size_t>(w) * gm + g) * d + e];
          }
          const int head = first_head + g;
          for (int e = 0; e < d; ++e) {
            if (split.splits == 1)
              out[static_cast<std::size_t>(head) * d + e] = sum[e] / weight;
            else
              partial_out[(static_cast<std::size_t>(head) * split.splits + b) * d + e] = sum[e];
          }
          partial_ml[(static_cast<std::size_t>(head) * split.splits + b) * 2] = mx;
          partial_ml[(static_cast<std::size_t>(head) * split.splits + b) * 2 + 1] = weight;
        }
      }
    }
  }
  if (split.splits == 1)
    return out;
  // The combine kernel: only the splits that hold slots (the others' partials are never written).
  const std::int64_t used = decode_attention_used_splits(n, split.chunk);
  for (int head = 0; head < in.heads; ++head) {
    float mx = neg_inf;
    for (std::int64_t b = 0; b < used; ++b)
      mx = std::max(mx, partial_ml[(static_cast<std::size_t>(head) * split.splits + b) * 2]);
    float weight = 0.0f;
    std::vector<float> sum(static_cast<std::size_t>(d), 0.0f);
    for (std::int64_t b = 0; b < used; ++b) {
      const auto at = static_cast<std::size_t>(head) * split.splits + b;
      const float f = std::exp2(partial_ml[2 * at] - mx);
      weight += f * partial_ml[2 * at + 1];
      for (int e = 0; e < d; ++e)
        sum[e] += f * partial_out[at * d + e];
    }
    for (int e = 0; e < d; ++e)
      out[static_cast<std::size_t>(head) * d + e] = weight > 0.0f ? sum[e] / weight : 0.0f;
  }
  return out;
}

// softmax(q k^T / sqrt(d)) v over slots [0, n) in float64; zeros when n is 0.
std::vector<double> reference_row(const row_inputs& in, std::int64_t n) {
  const int d = in.dim, group = in.heads / in.kv_heads;
  std::vector<double> out(static_cast<std::size_t>(in.heads) * d, 0.0);
  for (int h = 0; h < in.heads && n > 0; ++h) {
    const int kv = h / group;
    std::vector<double> score(static_cast<std::size_t>(n));
    for (std::int64_t s = 0; s < n; ++s) {
      double dot = 0.0;
      for (int e = 0; e < d; ++e)
        dot += static_cast<double>(in.q[static_cast<std::size_t>(h) * d + e]) * in.key(kv, s, e);
      score[s] = dot / std::sqrt(static_cast<double>(d));
    }
    const double mx = *std::max_element(score.begin(), score.end());
    double total = 0.0;
    for (auto& x : score)
      total += (x = std::exp(x - mx));
    for (std::int64_t s = 0; s < n; ++s)
      for (int e = 0; e < d; ++e)
        out[static_cast<std::size_t>(h) * d + e] += score[s] / total * in.value(kv, s, e);
  }
  return out;
}

} // namespace

TEST_CASE("the kernel's arithmetic replayed on the host equals a float64 softmax at the edges of lengths and splits") {
  std::mt19937 gen(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (bool aligned : {true, false}) {
    for (const auto& s : shapes) {
      for (std::int64_t slots : {1, 33, 100, 300}) {
        row_inputs in{s.heads, s.kv_heads, s.head_dim, slots, {}, {}, {}};
        in.q.resize(static_cast<std::size_t>(s.heads) * s.head_dim);
        in.k.resize(static_cast<std::size_t>(s.kv_heads) * slots * s.head_dim);
        in.v.resize(in.k.size());
        for (auto* t : {&in.q, &in.k, &in.v})
          for (auto& x : *t)
            x = normal(gen);
        for (auto& x : in.q)
          x *= 2.0f; // sharper softmaxes than unit scores give
        const auto p = plan_decode_attention(2, aligned, s.heads / s.kv_heads, s.head_dim);
        for (std::int64_t requested : {0, 1, 3, 1000}) {
          const auto split = choose_decode_attention_split(p, 1, s.kv_heads, slots, 132, requested);
          for (std::int64_t length : edge_lengths(slots, p.granule)) {
            CAPTURE(describe(2, aligned, s));
            CAPTURE(slots);
            CAPTURE(requested);
            CAPTURE(length);
            const auto got = emulate_row(p, split, in, length);
            const auto want = reference_row(in, decode_attention_visible(length, slots));
            double worst = 0.0;
            for (std::size_t i = 0; i < got.size(); ++i) {
              REQUIRE_MESSAGE(std::isfinite(got[i]), "element " << i);
              worst = std::max(worst, std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i])));
            }
            CHECK(worst <= 2e-5);
          }
        }
      }
    }
  }
}
