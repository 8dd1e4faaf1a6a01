// policy/kernels/attention_plan.hpp: how the decode attention kernel of policy/kernels/kernels.cu
// divides its work: which slots a block, a warp and a lane read, and which elements of a key a lane
// holds. Plain C++17 with no CUDA header, so that the same functions run in the kernel and in a
// host test of the partition (tests/unit/policy/test_attention_plan.cpp).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#  define CRUCIBLE_HOST_DEVICE __host__ __device__
#else
#  define CRUCIBLE_HOST_DEVICE
#endif

namespace crucible::policy::kernels {

/// Warps of one attention block; each owns a contiguous quarter of the block's slots.
inline constexpr int decode_attention_warps = 4;
/// Key steps a warp loads before it computes (each step is keys_per_step keys): the loads of a
/// lane in flight at once are this many keys and as many values.
inline constexpr int decode_attention_steps = 2;
/// Query heads of one KV head that a block serves at most: q and the accumulators of that many
/// heads live in each lane's registers (128 registers a thread in all, four blocks an SM). A
/// larger group takes several blocks, which read the same keys and values (the later ones
/// mostly from L2).
inline constexpr int decode_attention_max_heads_per_block = 4;
/// The largest head_dim the attention kernel takes.
inline constexpr std::int64_t decode_attention_max_head_dim = 256;

/// The work division of one decode attention launch (plan_decode_attention). Plain value.
struct decode_attention_plan {
  int vec = 1;              ///< elements per load: 16 bytes' worth when the data is so aligned, else 1
  int lanes_per_key = 32;   ///< lanes sharing one key or value row (a power of two, at most 32)
  int keys_per_step = 1;    ///< 32 / lanes_per_key: keys a warp reads in one step
  int vectors_per_lane = 1; ///< loads of `vec` elements a lane makes per key row
  int heads_per_block = 1;  ///< query heads of one KV head that a block serves: 1, 2 or 4
  int head_blocks = 1;      ///< blocks per (row, KV head, split): ceil(group / heads_per_block)
  int warps = decode_attention_warps; ///< warps of a block (decode_attention_wide_warps in a wide plan)
  int steps = decode_attention_steps; ///< key steps a warp loads before it computes
  int warp_tile = 1;        ///< slots a warp reads per round: keys_per_step * steps
  int granule = 1;          ///< slots per block worth splitting at: warps * warp_tile
};

/// The plan for `group` query heads per KV head of `head_dim` elements of `element_bytes` bytes;
/// `aligned`: q and the caches start at 16-byte boundaries and their strides are multiples of 16
/// bytes, so a lane may load 16 bytes at once (head_dim must then be a multiple of 16 bytes too,
/// or single elements are loaded). Unaligned data is served 4 heads a block (one kernel variant).
CRUCIBLE_HOST_DEVICE constexpr decode_attention_plan plan_decode_attention(int element_bytes, bool aligned, int group,
                                                                           int head_dim) {
  decode_attention_plan p;
  const int per_16 = 16 / element_bytes;
  p.vec = aligned && head_dim % per_16 == 0 ? per_16 : 1;
  const int vectors = head_dim / p.vec;
  int lanes = 1;
  while (lanes < vectors && lanes < 32)
    lanes *= 2;
  p.lanes_per_key = lanes;
  p.keys_per_step = 32 / lanes;
  p.vectors_per_lane = (vectors + lanes - 1) / lanes;
  p.heads_per_block = p.vec == 1 ? decode_attention_max_heads_per_block
                      : group <= 1 ? 1 : group <= 2 ? 2 : decode_attention_max_heads_per_block;
  p.head_blocks = (group + p.heads_per_block - 1) / p.heads_per_block;
  p.warp_tile = p.keys_per_step * decode_attention_steps;
  p.granule = decode_attention_warps * p.warp_tile;
  return p;
}

/// Loads per lane and key row the kernel has registers for with `vec` elements a load: enough
/// for decode_attention_max_head_dim (plan_decode_attention's vectors_per_lane never exceeds it).
CRUCIBLE_HOST_DEVICE constexpr int decode_attention_lane_vectors(int vec) {
  return decode_attention_max_head_dim / 32 / vec > 0 ? static_cast<int>(decode_attention_max_head_dim / 32 / vec) : 1;
}

/// Warps of a wide attention block: one block per (row, query head) covers all of the row's
/// slots, so no split and no combine kernel (a few rows at short lengths: a batch-1 decoding step).
inline constexpr int decode_attention_wide_warps = 16;
/// Rounds of each warp, at most, that a wide launch is chosen for (decode_attention_wide_suits).
inline constexpr int decode_attention_wide_rounds = 4;

/// Key steps a warp of a wide block loads before it computes with `vec` elements a load: as many
/// loads in flight as 128 registers a thread leave room for beside one query head (512 threads a
/// block, one block an SM): 8 with 16-byte loads of 2-byte elements, 4 of floats.
CRUCIBLE_HOST_DEVICE constexpr int decode_attention_wide_steps(int vec) {
  return 8 / decode_attention_lane_vectors(vec) > 0 ? 8 / decode_attention_lane_vectors(vec) : 1;
}

/// Warps of a wide block, besides decode_attention_wide_warps, that the kernel is built for: half
/// as many, so that a split of the merge (choose_decode_attention_merge_split) gives each warp a
/// whole round where sixteen warps would each have half a round.
inline constexpr int decode_attention_half_wide_warps = 8;

/// The wide plan: 16-byte loads (aligned data whose head_dim is whole 16 bytes; otherwise
/// `vec` stays 1 and the wide kernel is not used), one query head a block, `warps` warps
/// (decode_attention_wide_warps or decode_attention_half_wide_warps), decode_attention_wide_steps
/// steps a round.
CRUCIBLE_HOST_DEVICE constexpr decode_attention_plan plan_decode_attention_wide(int element_bytes, bool aligned,
                                                                                int group, int head_dim,
                                                                                int warps = decode_attention_wide_warps) {
  decode_attention_plan p = plan_decode_attention(element_bytes, aligned, group, head_dim);
  p.heads_per_block = 1;
  p.head_blocks = group;
  p.warps = warps;
  p.steps = p.vec > 1 ? decode_attention_wide_steps(p.vec) : decode_attention_steps;
  p.warp_tile = p.keys_per_step * p.steps;
  p.granule = p.warps * p.warp_tile;
  return p;
}

/// Whether a wide launch suits `rows` rows of `heads` query heads over `slots` cache slots on a
/// device of `sms` SMs: 16-byte loads, the blocks (one a query head) fill at most half the SMs
/// (the rest of the device would idle under one block's serial rounds otherwise), and a full
/// row takes each warp at most decode_attention_wide_rounds rounds. Depends on the shape only
/// (CUDA graphs keep the choice).
inline bool decode_attention_wide_suits(const decode_attention_plan& wide, std::int64_t rows, std::int64_t heads,
                                        std::int64_t slots, std::int64_t sms) {
  return wide.vec > 1 && rows >= 1 && rows * heads <= (sms < 2 ? 1 : sms / 2)
         && slots <= static_cast<std::int64_t>(decode_attention_wide_rounds) * wide.granule;
}

/// How a launch divides each row's slots: `splits` blocks of `chunk` slots each.
struct decode_attention_split {
  std::int64_t splits = 1, chunk = 0;
};

/// The split of `slots` cache slots for `rows` rows of `kv_heads` KV heads on a device of `sms`
/// SMs. `requested` splits (0: chosen here) are rounded so that each chunk is a whole number of
/// the plan's granules and no split starts past `slots`. The choice depends only on these
/// numbers, not on the rows' lengths, so a captured CUDA graph keeps it; blocks past a row's
/// length return at once. Chosen: about eight blocks per SM when every row is full, two waves
/// of the four 128-thread blocks of 128 registers that fit an SM at once (more, shorter blocks
/// leave a shorter tail to the last wave), at most 64 splits (the combine kernel reads every
/// split's partial row and gains nothing from more).
inline decode_attention_split choose_decode_attention_split(const decode_attention_plan& p, std::int64_t rows,
                                                            std::int64_t kv_heads, std::int64_t slots,
                                                            std::int64_t sms, std::int64_t requested) {
  const std::int64_t granules = (slots + p.granule - 1) / p.granule;
  std::int64_t splits = requested;
  if (splits <= 0) {
    std::int64_t blocks = rows * kv_heads * p.head_blocks;
    blocks = blocks < 1 ? 1 : blocks;
    splits = (8 * (sms < 1 ? 1 : sms) + blocks - 1) / blocks;
    splits = splits > 64 ? 64 : splits;
  }
  const std::int64_t most = granules < 65535 ? granules : 65535;
  splits = splits < 1 ? 1 : (splits > most ? most : splits);
  decode_attention_split out;
  out.chunk = (granules + splits - 1) / splits * p.granule;
  out.splits = (slots + out.chunk - 1) / out.chunk; // no split left without slots
  return out;
}

/// Slots a row with cache length `length` attends to: [0, min(length + 1, slots)), the new
/// token's slot included; 0 for a negative length.
CRUCIBLE_HOST_DEVICE inline std::int64_t decode_attention_visible(std::int64_t length, std::int64_t slots) {
  const std::int64_t n = length + 1;
  return n < 0 ? 0 : (n > slots ? slots : n);
}

/// Splits of `chunk` slots that hold any of a row's `visible` slots (the others exit at once).
CRUCIBLE_HOST_DEVICE inline std::int64_t decode_attention_used_splits(std::int64_t visible, std::int64_t chunk) {
  return (visible + chunk - 1) / chunk;
}

/// A half-open range of slots.
struct slot_range {
  std::int64_t begin = 0, end = 0;
};

/// The slots warp `warp` of split `split` reads of a row with `visible` slots: the warp's
/// quarter of the split's chunk (chunk a multiple of decode_attention_warps), cut at `visible`;
/// empty (end == begin) past it.
CRUCIBLE_HOST_DEVICE inline slot_range decode_attention_warp_slots(std::int64_t visible, std::int64_t chunk,
                                                                   std::int64_t split, int warp) {
  const std::int64_t per_warp = chunk / decode_attention_warps;
  slot_range r;
  r.begin = split * chunk + warp * per_warp;
  const std::int64_t end = r.begin + per_warp;
  r.end = end < visible ? end : visible;
  if (r.end < r.begin)
    r.end = r.begin;
  return r;
}

/// The slots warp `warp` of a wide block reads of a row with `visible` slots: the visible slots
/// cut into `warps` parts of ceil(visible / warps), in order (empty past the last).
CRUCIBLE_HOST_DEVICE inline slot_range decode_attention_even_slots(std::int64_t visible, int warps, int warp) {
  const std::int64_t per_warp = visible <= 0 ? 0 : (visible + warps - 1) / warps;
  slot_range r;
  r.begin = per_warp * warp;
  r.begin = r.begin < visible ? r.begin : (visible < 0 ? 0 : visible);
  const std::int64_t end = r.begin + per_warp;
  r.end = end < visible ? end : (visible < r.begin ? r.begin : visible);
  return r;
}

/// The slots warp `warp` of a wide block of split `split` (of `chunk` slots each) reads of a row
/// with `visible` slots: the split's visible slots cut evenly among `warps`
/// (decode_attention_even_slots); with one split of chunk >= visible, all of the row's.
CRUCIBLE_HOST_DEVICE inline slot_range decode_attention_wide_slots(std::int64_t visible, std::int64_t chunk,
                                                                   std::int64_t split, int warps, int warp) {
  const std::int64_t first = split * chunk;
  std::int64_t in = visible - first;
  in = in < 0 ? 0 : (in > chunk ? chunk : in);
  slot_range r = decode_attention_even_slots(in, warps, warp);
  r.begin += first;
  r.end += first;
  return r;
}

/// Splits, at most, of a wide launch whose partials the o projection merges as it stages its input
/// (decode_attention_args::merge_later, small_gemm_args::attention): its registers hold one value
/// of each.
inline constexpr int decode_attention_merge_max_splits = 8;

/// The split of a wide launch over `slots` slots for `rows` rows of `heads` query heads on `sms`
/// SMs whose partials the o projection merges: as many splits as keep the blocks (one an SM)
/// within half the SMs, at most decode_attention_merge_max_splits, chunks a whole number of a
/// wide block's key steps (warps * keys_per_step slots) and each split holding slots. {0, 0}
/// where that leaves fewer than two splits or a chunk that takes a warp more than
/// decode_attention_wide_rounds rounds: the launch is not worth splitting, or too long. Depends
/// on the shape only (CUDA graphs keep the choice).
/// `most` (2 to decode_attention_merge_max_splits) caps the splits further.
inline decode_attention_split choose_decode_attention_merge_split(const decode_attention_plan& wide, std::int64_t rows,
                                                                  std::int64_t heads, std::int64_t slots,
                                                                  std::int64_t sms,
                                                                  std::int64_t most = decode_attention_merge_max_splits) {
  decode_attention_split none{0, 0};
  if (wide.vec <= 1 || rows < 1 || heads < 1 || slots < 1)
    return none;
  most = most > decode_attention_merge_max_splits ? decode_attention_merge_max_splits : most;
  std::int64_t splits = (sms < 2 ? 1 : sms / 2) / (rows * heads);
  splits = splits > most ? most : splits;
  const std::int64_t step = static_cast<std::int64_t>(wide.warps) * wide.keys_per_step;
  const std::int64_t steps = (slots + step - 1) / step;
  splits = splits > steps ? steps : splits;
  if (splits < 2)
    return none;
  decode_attention_split out;
  out.chunk = (steps + splits - 1) / splits * step;
  out.splits = (slots + out.chunk - 1) / out.chunk;
  if (out.splits < 2 || out.chunk > static_cast<std::int64_t>(decode_attention_wide_rounds) * wide.granule)
    return none;
  return out;
}

/// The slot that `lane` reads in step `step` of the warp round starting at slot `round_begin`
/// (valid when below the warp's range end).
CRUCIBLE_HOST_DEVICE inline std::int64_t decode_attention_lane_slot(const decode_attention_plan& p,
                                                                    std::int64_t round_begin, int step, int lane) {
  return round_begin + step * p.keys_per_step + lane / p.lanes_per_key;
}

/// The first element of load `i` (< vectors_per_lane) of `lane` within a key, value or query
/// row; the load reads elements [e, e + vec) and exists when e < head_dim.
CRUCIBLE_HOST_DEVICE inline int decode_attention_lane_element(const decode_attention_plan& p, int lane, int i) {
  return ((lane & (p.lanes_per_key - 1)) + p.lanes_per_key * i) * p.vec;
}

} // namespace crucible::policy::kernels
