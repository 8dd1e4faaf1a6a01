// policy/kernels/decode_layers.cu: a one-row decoding step's layers in one persistent kernel (see
// policy/kernels/decode_layers.hpp for why). The residual stream comes in from the embedding and
// goes out to the final norm; weights stream through shared memory; the stages of a layer meet at
// counters in global memory.
//
// Layout of a block: warps 0-7 compute ("consumers"), warp 8 is the producer. The producer walks
// the block's weight rows of every layer (q/k/v, o, gate/up, down, in that order) and copies them
// with cp.async.bulk into a ring of layers_slots slots, each signalled by a "full" mbarrier; the
// consumers take the slots in the same order and free them through an "empty" mbarrier. Each
// stage's rows are split evenly among the blocks. A stage's consumers wait until every block has
// passed the stage before (a counter reaching gridDim.x), read its outputs from L2 (ld.cg), and
// add one to their stage's counter when their own outputs are written.
#include "policy/kernels/decode_layers.hpp"

#include "policy/kernels/kernel_math.cuh"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace crucible::policy::kernels {

namespace {

constexpr int layers_consumer_warps = 8;
constexpr int layers_consumers = 32 * layers_consumer_warps;
constexpr int layers_threads = layers_consumers + 32;
constexpr int layers_slots = 5;
constexpr int layers_slot_bytes = 32 * 1024;
[[maybe_unused]] constexpr int layers_max_slot_rows = 128; // rows of a slot, so that its partial sums fit psum
[[maybe_unused]] constexpr int layers_min_chunk = 64;      // attention: fewest slots a split takes
[[maybe_unused]] constexpr int stages = decode_layers_stages;                 // q/k/v, attention, o, gate/up, down

enum stage : int { s_qkv = 0, s_attention = 1, s_o = 2, s_gate_up = 3, s_down = 4 };

// The rows of a weight matrix that block b of g takes in a stage, and how they fill slots.
struct share {
  const unsigned char* weight = nullptr;
  long long row0 = 0;     // first row (for gate/up: first intermediate column)
  int rows = 0;           // rows (gate/up: columns; each brings its gate row and its up row)
  long long row_bytes = 0;
  long long up_offset = 0; // gate/up: bytes from a gate row to its up row; 0 otherwise
  int per_slot = 1;        // rows (columns) a slot holds
  [[maybe_unused]] __host__ __device__ int slot_count() const { return rows == 0 ? 0 : (rows + per_slot - 1) / per_slot; }
};

template <class T>
__host__ __device__ share stage_share(const decode_layers_args& a, int layer, int s, int b, int g) {
  const decode_layer_params& p = a.layer[layer];
  long long n = 0, k = 0;
  share out;
  switch (s) {
    case s_qkv: n = (a.heads + 2 * a.kv_heads) * a.head_dim, k = a.hidden, out.weight = static_cast<const unsigned char*>(p.qkv_weight); break;
    case s_o: n = a.hidden, k = a.heads * a.head_dim, out.weight = static_cast<const unsigned char*>(p.o_weight); break;
    case s_gate_up: n = a.inter, k = a.hidden, out.weight = static_cast<const unsigned char*>(p.gate_up_weight); break;
    default: n = a.hidden, k = a.inter, out.weight = static_cast<const unsigned char*>(p.down_weight); break;
  }
  out.row0 = n * b / g;
  out.rows = static_cast<int>(n * (b + 1) / g - out.row0);
  out.row_bytes = k * static_cast<long long>(sizeof(T));
  const long long per_row = s == s_gate_up ? 2 * out.row_bytes : out.row_bytes;
  out.up_offset = s == s_gate_up ? n * out.row_bytes : 0;
  const long long fit = layers_slot_bytes / per_row;
  out.per_slot = static_cast<int>(fit < layers_max_slot_rows ? fit : layers_max_slot_rows);
  return out;
}

// Byte offsets of the work space after the ring: the stage's inputs (xs), then the attention's
// pieces for GQ query heads of dimension D and tiles of `tile` cache slots. The keys and values
// of an attention item's first tile are loaded while the block still works on the q/k/v stage,
// so the two regions do not overlap.
struct work_space {
  int qrot, knew, vnew, scores, acc, mlc, kt, vt, end;
};

template <class T>
__host__ __device__ work_space work_layout(const decode_layers_args& a, int tile) {
  auto up16 = [](long long x) { return static_cast<int>((x + 15) / 16 * 16); };
  const int group = static_cast<int>(a.heads / a.kv_heads), d = static_cast<int>(a.head_dim);
  const int row = d * static_cast<int>(sizeof(T)); // bytes of a head's row: whole 16 bytes
  long long widest = a.hidden > a.inter ? a.hidden : a.inter;
  widest = widest > a.heads * a.head_dim ? widest : a.heads * a.head_dim;
  work_space s{};
  s.qrot = up16(widest * static_cast<long long>(sizeof(T)));
  s.knew = s.qrot + up16(group * row);
  s.vnew = s.knew + up16(row);
  s.scores = s.vnew + up16(row);
  s.acc = s.scores + up16(group * tile * 4);
  s.mlc = s.acc + up16(group * d * 4);
  s.kt = s.mlc + up16(3 * group * 4);
  s.vt = s.kt + tile * (row + 16); // keys padded by 16 bytes a slot: conflict-free dots
  s.end = s.vt + tile * row;
  return s;
}

std::size_t shared_bytes(std::size_t work) { return static_cast<std::size_t>(layers_slots) * layers_slot_bytes + work; }

// ---- device primitives (sm_90) ------------------------------------------------------------------

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
  } while (!done);
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                 smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

__device__ __forceinline__ void prefetch_l2(const void* src, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// The consumers' barrier (named barrier 1; the producer never joins it).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(layers_consumers) : "memory"); }

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void add_release(unsigned* p) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
}

// Loads of what other blocks wrote in this launch: from L2, never a stale L1 line.
template <class T>
__device__ __forceinline__ float load_cg(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return __ldcg(p);
  } else {
    const unsigned short raw = __ldcg(reinterpret_cast<const unsigned short*>(p));
    T v;
    memcpy(&v, &raw, sizeof v);
    return to_float(v);
  }
}

// The sum over the consumers; every consumer gets it. `red` holds 32 floats.
__device__ float consumers_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0)
    red[warp] = v;
  consumers_sync();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < layers_consumer_warps; ++w)
    total += red[w];
  consumers_sync(); // red may be reused
  return total;
}

// ---- the producer -------------------------------------------------------------------------------

template <class T>
__device__ void produce(const decode_layers_args& a, unsigned char* ring, unsigned long long* full,
                        unsigned long long* empty) {
  constexpr int weighted[] = {s_qkv, s_o, s_gate_up, s_down}; // the stages with weights, in order
  // The block's share of a layer's weights toward L2, so that the ring's copies find them there:
  // memory then streams at its own pace while the consumers take slots in bursts.
  auto prefetch_layer = [&](int l) {
    if (!a.prefetch_l2 || l >= a.layers)
      return;
    for (int s : weighted) {
      const share sh = stage_share<T>(a, l, s, blockIdx.x, gridDim.x);
      const unsigned bytes = static_cast<unsigned>(sh.rows * sh.row_bytes);
      if (bytes == 0)
        continue;
      const unsigned char* src = sh.weight + sh.row0 * sh.row_bytes;
      prefetch_l2(src, bytes);
      if (sh.up_offset != 0)
        prefetch_l2(src + sh.up_offset, bytes);
    }
  };
  prefetch_layer(0);
  unsigned fill = 0;
  for (int l = 0; l < a.layers; ++l) {
    prefetch_layer(l + 1);
    for (int s : weighted) {
      const share sh = stage_share<T>(a, l, s, blockIdx.x, gridDim.x);
      for (int j = 0; j < sh.slot_count(); ++j, ++fill) {
        const int slot = static_cast<int>(fill % layers_slots);
        mbar_wait(&empty[slot], ((fill / layers_slots) & 1u) ^ 1u);
        const int first = j * sh.per_slot, n = min(sh.per_slot, sh.rows - first);
        const unsigned bytes = static_cast<unsigned>(n * sh.row_bytes);
        const unsigned char* src = sh.weight + (sh.row0 + first) * sh.row_bytes;
        unsigned char* dst = ring + static_cast<long long>(slot) * layers_slot_bytes;
        mbar_expect(&full[slot], sh.up_offset != 0 ? 2 * bytes : bytes);
        bulk_copy(dst, src, bytes, &full[slot]);
        if (sh.up_offset != 0)
          bulk_copy(dst + bytes, src + sh.up_offset, bytes, &full[slot]);
      }
    }
  }
}

// ---- the consumers ------------------------------------------------------------------------------

template <class T>
struct consumer {
  const decode_layers_args& a;
  unsigned char* ring;
  unsigned char* work;
  unsigned long long* full;
  unsigned long long* empty;
  float* psum;
  float* red;
  unsigned use = 0; // slots taken so far, in the producer's order
  static constexpr int vec = 16 / sizeof(T);

  __device__ unsigned* counter(int layer, int s) const { return a.counters + layer * stages + s; }

  __device__ void wait_for(int layer, int s) const {
    if (threadIdx.x == 0) {
      const unsigned* c = counter(layer, s);
      while (load_acquire(c) < gridDim.x) {
      }
    }
    consumers_sync();
  }

  __device__ void passed(int layer, int s) const {
    consumers_sync(); // every consumer's writes of the stage are issued
    if (threadIdx.x == 0) {
      __threadfence();
      add_release(counter(layer, s));
    }
  }

  // xs = RMSNorm(residual) with `weight`, rounded as add_rms_norm rounds.
  __device__ void normalise(const void* weight) {
    const T* res = static_cast<const T*>(a.residual);
    const T* w = static_cast<const T*>(weight);
    T* xs = reinterpret_cast<T*>(work);
    const int h = static_cast<int>(a.hidden);
    constexpr int held = 8; // entries a consumer keeps in registers between the two passes
    float v[held], wv[held];
#pragma unroll
    for (int j = 0; j < held; ++j) { // the weights' loads in flight with the residual's
      const int i = threadIdx.x + j * layers_consumers;
      wv[j] = i < h ? to_float(w[i]) : 0.0f;
    }
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < held; ++j) {
      const int i = threadIdx.x + j * layers_consumers;
      v[j] = i < h ? load_cg(res + i) : 0.0f;
      sum += __fmul_rn(v[j], v[j]);
    }
    for (int i = threadIdx.x + held * layers_consumers; i < h; i += layers_consumers) {
      const float x = load_cg(res + i);
      sum += __fmul_rn(x, x);
    }
    const float inv = rms_inverse(consumers_sum(sum, red), 1.0f / static_cast<float>(h), a.eps);
#pragma unroll
    for (int j = 0; j < held; ++j) {
      const int i = threadIdx.x + j * layers_consumers;
      if (i < h)
        xs[i] = rms_normed<T>(v[j], wv[j], inv);
    }
    for (int i = threadIdx.x + held * layers_consumers; i < h; i += layers_consumers)
      xs[i] = rms_normed<T>(load_cg(res + i), to_float(w[i]), inv);
    consumers_sync();
  }

  // The block's rows of one matrix-vector stage over xs (k wide); finish(row, value, up_value)
  // runs on one consumer per row with the float sums (the up row's for gate/up).
  template <class F>
  __device__ void project(int layer, int s, long long k, F&& finish) {
    const share sh = stage_share<T>(a, layer, s, blockIdx.x, gridDim.x);
    const int kv = static_cast<int>(k / vec);
    const uint4* xs = reinterpret_cast<const uint4*>(work);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool paired = sh.up_offset != 0;
    for (int j = 0; j < sh.slot_count(); ++j, ++use) {
      const int slot = static_cast<int>(use % layers_slots);
      const int first = j * sh.per_slot, n = min(sh.per_slot, sh.rows - first);
      const int rows = paired ? 2 * n : n; // in the slot: n gate rows, then their n up rows
      // Warps split a row's k when rows are fewer than warps.
      const int split = max(1, min(layers_consumer_warps / rows, kv / 32));
      mbar_wait(&full[slot], (use / layers_slots) & 1u);
      const uint4* w = reinterpret_cast<const uint4*>(ring + static_cast<long long>(slot) * layers_slot_bytes);
      for (int u = warp; u < rows * split; u += layers_consumer_warps) {
        const int r = u / split, part = u - r * split;
        const int v0 = kv * part / split, v1 = kv * (part + 1) / split;
        const uint4* wr = w + static_cast<long long>(r) * kv;
        float acc = 0.0f;
        for (int v = v0 + lane; v < v1; v += 32)
          acc = dot16<T>(wr[v], xs[v], acc);
        acc = warp_sum(acc);
        if (lane == 0)
          psum[u] = acc;
      }
      __syncwarp();
      if (lane == 0)
        mbar_arrive(&empty[slot]); // this warp is done with the slot
      consumers_sync();
      if (threadIdx.x < n) {
        const int r = threadIdx.x;
        float y = 0.0f, yu = 0.0f;
        for (int p = 0; p < split; ++p)
          y += psum[r * split + p];
        if (paired)
          for (int p = 0; p < split; ++p)
            yu += psum[(n + r) * split + p];
        finish(sh.row0 + first + r, y, yu);
      }
      consumers_sync(); // psum is reused
    }
  }

  // The inputs of the down projection: act into xs.
  __device__ void stage_act() {
    const uint4* act = static_cast<const uint4*>(a.act);
    uint4* xs = reinterpret_cast<uint4*>(work);
    for (int i = threadIdx.x; i < a.inter / vec; i += layers_consumers)
      xs[i] = __ldcg(act + i);
    consumers_sync();
  }

  // The attention's splits combined into xs: [heads * head_dim] in T.
  __device__ void combine(int splits) {
    const int d = static_cast<int>(a.head_dim), width = d + 2;
    T* xs = reinterpret_cast<T*>(work);
    for (int p = threadIdx.x; p < a.heads * d; p += layers_consumers) {
      const int h = p / d, e = p - h * d;
      const float* part = a.partial + static_cast<long long>(h) * decode_layers_max_splits * width;
      // Every split's three values loaded at once (unrolled over the most splits): one round
      // trip to L2, not one per split.
      float ms[decode_layers_max_splits], ls[decode_layers_max_splits], os[decode_layers_max_splits];
#pragma unroll
      for (int c = 0; c < decode_layers_max_splits; ++c) {
        const bool in = c < splits;
        ms[c] = in ? __ldcg(part + c * width) : -INFINITY;
        ls[c] = in ? __ldcg(part + c * width + 1) : 0.0f;
        os[c] = in ? __ldcg(part + c * width + 2 + e) : 0.0f;
      }
      float m = -INFINITY;
#pragma unroll
      for (int c = 0; c < decode_layers_max_splits; ++c)
        m = fmaxf(m, ms[c]);
      float num = 0.0f, den = 0.0f;
#pragma unroll
      for (int c = 0; c < decode_layers_max_splits; ++c) {
        if (c < splits) {
          const float f = expf(ms[c] - m);
          den += ls[c] * f;
          num += os[c] * f;
        }
      }
      xs[p] = from_float<T>(num / den);
    }
    consumers_sync();
  }

  // The attention item a block takes first in a layer (it < items), and its slots.
  struct item {
    int g = 0, c = 0;
    long long s0 = 0, s1 = 0;
  };
  __device__ item item_of(int it, int splits, long long chunk, long long visible) const {
    item x;
    x.g = it / splits;
    x.c = it - x.g * splits;
    x.s0 = x.c * chunk;
    x.s1 = min(visible, x.s0 + chunk);
    return x;
  }

  // cp.async of the cached keys and values of slots [t0, t0 + n) of KV head g into the tile, all
  // but slot `pos` (the new token's, written by this step); cp_wait() completes them.
  __device__ void load_tile(int layer, int g, long long t0, int n, long long pos) {
    const int rv = static_cast<int>(a.head_dim) / vec;
    const auto lay = work_layout<T>(a, a.kv_tile);
    const decode_layer_params& p = a.layer[layer];
    const T* kbase = static_cast<const T*>(p.k_cache) + g * a.head_stride;
    const T* vbase = static_cast<const T*>(p.v_cache) + g * a.head_stride;
    uint4* kt = reinterpret_cast<uint4*>(work + lay.kt);
    uint4* vt = reinterpret_cast<uint4*>(work + lay.vt);
    for (int q = threadIdx.x; q < n * rv; q += layers_consumers) {
      const int s = q / rv, v = q - s * rv;
      const long long slot = t0 + s;
      if (slot == pos)
        continue;
      cp_async16(kt + s * (rv + 1) + v, reinterpret_cast<const uint4*>(kbase + slot * a.slot_stride) + v);
      cp_async16(vt + s * rv + v, reinterpret_cast<const uint4*>(vbase + slot * a.slot_stride) + v);
    }
    cp_commit();
  }

  // One attention item: the query heads of KV head g over slots [s0, s1), partial results out.
  // `loaded`: its first tile's loads are already in flight (load_tile).
  __device__ void attend(int layer, const item& x, long long pos, bool loaded) {
    const int d = static_cast<int>(a.head_dim), half = d / 2, tile = a.kv_tile;
    const int group = static_cast<int>(a.heads / a.kv_heads);
    const int rv = d / vec; // 16-byte vectors in a head's row
    const int g = x.g;
    const auto lay = work_layout<T>(a, tile);
    T* qrot = reinterpret_cast<T*>(work + lay.qrot);
    T* knew = reinterpret_cast<T*>(work + lay.knew);
    T* vnew = reinterpret_cast<T*>(work + lay.vnew);
    uint4* kt = reinterpret_cast<uint4*>(work + lay.kt);
    uint4* vt = reinterpret_cast<uint4*>(work + lay.vt);
    float* sc = reinterpret_cast<float*>(work + lay.scores);
    float* acc = reinterpret_cast<float*>(work + lay.acc);
    float* mlc = reinterpret_cast<float*>(work + lay.mlc); // m, l, correction per head
    const T* qkv = static_cast<const T*>(a.qkv);
    const decode_layer_params& p = a.layer[layer];
    const bool has_new = pos < a.slots && pos >= x.s0 && pos < x.s1;
    const float fpos = static_cast<float>(pos);
    // q rotated (as q_out would hold it); the new key rotated and value, written to the cache.
    for (int idx = threadIdx.x; idx < group * half; idx += layers_consumers) {
      const int i = idx / half, e = idx - i * half;
      const T* q = qkv + static_cast<long long>(g * group + i) * d;
      rope_pair<T>(load_cg(q + e), load_cg(q + e + half), fpos, a.inv_freq[e], a.attention_scaling, qrot + i * d, e,
                   half);
    }
    if (has_new) {
      const T* k = qkv + (a.heads + g) * d;
      const T* v = qkv + (a.heads + a.kv_heads + g) * d;
      for (int e = threadIdx.x; e < half; e += layers_consumers)
        rope_pair<T>(load_cg(k + e), load_cg(k + e + half), fpos, a.inv_freq[e], a.attention_scaling, knew, e, half);
      for (int e = threadIdx.x; e < d; e += layers_consumers)
        vnew[e] = from_float<T>(load_cg(v + e));
    }
    for (int i = threadIdx.x; i < group; i += layers_consumers) {
      mlc[i] = -INFINITY;
      mlc[group + i] = 0.0f;
    }
    for (int i = threadIdx.x; i < group * d; i += layers_consumers)
      acc[i] = 0.0f;
    consumers_sync();
    if (has_new) {
      T* kc = static_cast<T*>(p.k_cache) + g * a.head_stride + pos * a.slot_stride;
      T* vc = static_cast<T*>(p.v_cache) + g * a.head_stride + pos * a.slot_stride;
      for (int e = threadIdx.x; e < d; e += layers_consumers) {
        kc[e] = knew[e];
        vc[e] = vnew[e];
      }
    }
    const uint4* qv = reinterpret_cast<const uint4*>(qrot);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (long long t0 = x.s0; t0 < x.s1; t0 += tile) {
      const int n = static_cast<int>(min(static_cast<long long>(tile), x.s1 - t0));
      if (!(loaded && t0 == x.s0))
        load_tile(layer, g, t0, n, pos);
      if (has_new && pos >= t0 && pos < t0 + n) {
        const int s = static_cast<int>(pos - t0);
        for (int v = threadIdx.x; v < rv; v += layers_consumers) {
          kt[s * (rv + 1) + v] = reinterpret_cast<const uint4*>(knew)[v];
          vt[s * rv + v] = reinterpret_cast<const uint4*>(vnew)[v];
        }
      }
      cp_wait();
      consumers_sync();
      for (int q = threadIdx.x; q < group * n; q += layers_consumers) {
        const int i = q / n, s = q - i * n;
        float dot = 0.0f;
        for (int v = 0; v < rv; ++v)
          dot = dot16<T>(kt[s * (rv + 1) + v], qv[i * rv + v], dot);
        sc[i * tile + s] = dot * a.scale;
      }
      consumers_sync();
      for (int i = warp; i < group; i += layers_consumer_warps) {
        float m = -INFINITY;
        for (int s = lane; s < n; s += 32)
          m = fmaxf(m, sc[i * tile + s]);
        m = fmaxf(warp_max(m), mlc[i]);
        float sum = 0.0f;
        for (int s = lane; s < n; s += 32) {
          const float e = expf(sc[i * tile + s] - m);
          sc[i * tile + s] = e;
          sum += e;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
          const float corr = expf(mlc[i] - m); // 0 on the first tile (exp(-inf))
          mlc[group + i] = mlc[group + i] * corr + sum;
          mlc[2 * group + i] = corr;
          mlc[i] = m;
        }
      }
      consumers_sync();
      const T* vts = reinterpret_cast<const T*>(vt);
      for (int q = threadIdx.x; q < group * d; q += layers_consumers) {
        const int i = q / d, e = q - i * d;
        const float* si = sc + i * tile;
        float o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f; // four chains: the loads overlap
        int s = 0;
        for (; s + 4 <= n; s += 4) {
          o0 = fmaf(si[s], to_float(vts[s * d + e]), o0);
          o1 = fmaf(si[s + 1], to_float(vts[(s + 1) * d + e]), o1);
          o2 = fmaf(si[s + 2], to_float(vts[(s + 2) * d + e]), o2);
          o3 = fmaf(si[s + 3], to_float(vts[(s + 3) * d + e]), o3);
        }
        for (; s < n; ++s)
          o0 = fmaf(si[s], to_float(vts[s * d + e]), o0);
        acc[q] = acc[q] * mlc[2 * group + i] + ((o0 + o1) + (o2 + o3));
      }
      consumers_sync();
    }
    const int width = d + 2;
    for (int q = threadIdx.x; q < group * width; q += layers_consumers) {
      const int i = q / width, e = q - i * width;
      float* out = a.partial + (static_cast<long long>(g * group + i) * decode_layers_max_splits + x.c) * width;
      out[e] = e == 0 ? mlc[i] : e == 1 ? mlc[group + i] : acc[i * d + e - 2];
    }
    consumers_sync(); // the work space is reused
  }

  __device__ void stamp(int layer, int s, int end) const {
    if (a.timeline != nullptr && threadIdx.x == 0)
      a.timeline[((static_cast<long long>(layer) * stages + s) * gridDim.x + blockIdx.x) * 2 + end] = global_ns();
  }

  __device__ void run() {
    const long long pos = a.lengths[0];
    const long long visible = min(pos + 1, static_cast<long long>(a.slots));
    const int splits = static_cast<int>(
      max(1LL, min(static_cast<long long>(decode_layers_max_splits), (visible + layers_min_chunk - 1) / layers_min_chunk)));
    const long long chunk = (visible + splits - 1) / splits;
    const int items = static_cast<int>(a.kv_heads) * splits;
    const bool attends = static_cast<int>(blockIdx.x) < items;
    for (int l = 0; l < a.layers; ++l) {
      const decode_layer_params& p = a.layer[l];
      // The first attention item's cached keys and values, in flight through the q/k/v stage.
      const item first = item_of(attends ? blockIdx.x : 0, splits, chunk, visible);
      if (attends)
        load_tile(l, first.g, first.s0, static_cast<int>(min(static_cast<long long>(a.kv_tile), first.s1 - first.s0)),
                  pos);
      // 1. norm, q/k/v + bias (one rounding) into the scratch.
      if (l > 0)
        wait_for(l - 1, s_down);
      stamp(l, s_qkv, 0);
      normalise(p.input_norm);
      T* qkv = static_cast<T*>(a.qkv);
      const T* qkv_bias = static_cast<const T*>(p.qkv_bias);
      project(l, s_qkv, a.hidden, [&](long long row, float y, float) {
        qkv[row] = from_float<T>(qkv_bias == nullptr ? y : __fadd_rn(y, to_float(qkv_bias[row])));
      });
      stamp(l, s_qkv, 1);
      passed(l, s_qkv);
      // 2. attention: RoPE, the cache write and each split's partial softmax. Blocks without an
      // item pass at once.
      if (attends) {
        wait_for(l, s_qkv);
        stamp(l, s_attention, 0);
        for (int it = blockIdx.x; it < items; it += gridDim.x)
          attend(l, item_of(it, splits, chunk, visible), pos, it == static_cast<int>(blockIdx.x));
      } else {
        stamp(l, s_attention, 0);
      }
      stamp(l, s_attention, 1);
      passed(l, s_attention);
      // 3. the splits combined, o projection, residual add.
      wait_for(l, s_attention);
      stamp(l, s_o, 0);
      combine(splits);
      T* res = static_cast<T*>(a.residual);
      const T* o_bias = static_cast<const T*>(p.o_bias);
      project(l, s_o, a.heads * a.head_dim, [&](long long row, float y, float) {
        const float yr = rounded<T>(o_bias == nullptr ? y : __fadd_rn(y, to_float(o_bias[row])));
        res[row] = from_float<T>(__fadd_rn(load_cg(res + row), yr));
      });
      stamp(l, s_o, 1);
      passed(l, s_o);
      // 4. norm, gate/up + bias, silu(gate) * up.
      wait_for(l, s_o);
      stamp(l, s_gate_up, 0);
      normalise(p.post_norm);
      T* act = static_cast<T*>(a.act);
      const T* gu_bias = static_cast<const T*>(p.gate_up_bias);
      project(l, s_gate_up, a.hidden, [&](long long col, float yg, float yu) {
        const float g = rounded<T>(gu_bias == nullptr ? yg : __fadd_rn(yg, to_float(gu_bias[col])));
        const float u = rounded<T>(gu_bias == nullptr ? yu : __fadd_rn(yu, to_float(gu_bias[a.inter + col])));
        act[col] = silu_times<T>(g, u);
      });
      stamp(l, s_gate_up, 1);
      passed(l, s_gate_up);
      // 5. down projection, residual add.
      wait_for(l, s_gate_up);
      stamp(l, s_down, 0);
      stage_act();
      const T* down_bias = static_cast<const T*>(p.down_bias);
      project(l, s_down, a.inter, [&](long long row, float y, float) {
        const float yr = rounded<T>(down_bias == nullptr ? y : __fadd_rn(y, to_float(down_bias[row])));
        res[row] = from_float<T>(__fadd_rn(load_cg(res + row), yr));
      });
      stamp(l, s_down, 1);
      passed(l, s_down);
    }
  }
};
#endif

template <class T>
__global__ void __launch_bounds__(layers_threads, 1) decode_layers_kernel(const __grid_constant__ decode_layers_args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char shared[];
  __shared__ __align__(8) unsigned long long full[layers_slots], empty[layers_slots];
  __shared__ float psum[2 * layers_max_slot_rows];
  __shared__ float red[32];
  if (threadIdx.x == 0) {
    for (int s = 0; s < layers_slots; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], layers_consumer_warps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x >= layers_consumers) {
    if (threadIdx.x == layers_consumers)
      produce<T>(a, shared, full, empty);
    return;
  }
  consumer<T> c{a, shared, shared + layers_slots * layers_slot_bytes, full, empty, psum, red};
  c.run();
#else
  (void) a;
  __trap(); // decode_layers_supported refuses devices below compute capability 9.0
#endif
}

std::atomic<bool> layers_on{false};                      // set_decode_layers
std::atomic<unsigned long long*> timeline_buffer{nullptr}; // set_decode_layers_timeline
std::atomic<bool> layers_prefetch{false};                // set_decode_layers_prefetch

// The largest attention tile (cache slots) whose work space fits beside the ring in `optin`
// bytes of shared memory, or 0.
template <class T>
int pick_tile(const decode_layers_args& a, int optin) {
  for (int tile : {128, 64, 32})
    if (shared_bytes(static_cast<std::size_t>(work_layout<T>(a, tile).end)) + 2048 <= static_cast<std::size_t>(optin))
      return tile;
  return 0;
}

} // namespace

void set_decode_layers(bool on) { layers_on.store(on, std::memory_order_relaxed); }
void set_decode_layers_prefetch(bool on) { layers_prefetch.store(on, std::memory_order_relaxed); }
void set_decode_layers_timeline(unsigned long long* buffer) { timeline_buffer.store(buffer, std::memory_order_relaxed); }

int decode_layers_blocks() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0;
  return sms;
}

std::int64_t decode_layers_timeline_entries(std::int64_t layers) {
  return layers * decode_layers_stages * decode_layers_blocks() * 2;
}
bool decode_layers_enabled() { return layers_on.load(std::memory_order_relaxed); }

bool decode_layers_supported(dtype t, std::int64_t layers, std::int64_t hidden, std::int64_t inter,
                             std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim) {
  if (layers < 1 || layers > decode_layers_max_layers || hidden <= 0 || inter <= 0 || heads <= 0 || kv_heads <= 0
      || heads % kv_heads != 0 || head_dim <= 0 || head_dim % 2 != 0)
    return false;
  std::int64_t size = 0;
  dispatch(t, [&](auto* tag) {
    size = static_cast<std::int64_t>(sizeof(*tag));
    return cudaSuccess;
  });
  const std::int64_t vec = 16 / size;
  // Rows of whole 16 bytes; a slot holds a gate/up pair of rows and a down row.
  if (hidden % vec != 0 || inter % vec != 0 || head_dim % vec != 0 || (heads * head_dim) % vec != 0)
    return false;
  if (2 * hidden * size > layers_slot_bytes || inter * size > layers_slot_bytes
      || heads * head_dim * size > layers_slot_bytes)
    return false;
  int device = 0, major = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess
      || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess
      || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return false;
  if (major < 9)
    return false;
  decode_layers_args a;
  a.hidden = hidden, a.inter = inter, a.heads = heads, a.kv_heads = kv_heads, a.head_dim = head_dim;
  int tile = 0;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    tile = pick_tile<T>(a, optin);
    return cudaSuccess;
  });
  return tile > 0;
}

cudaError_t decode_layers(dtype t, const decode_layers_args& a, cudaStream_t stream) {
  return dispatch(t, [&](auto* tag) -> cudaError_t {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto kernel = &decode_layers_kernel<T>;
    int device = 0, sms = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess || (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess
        || (e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) != cudaSuccess)
      return e;
    if (device < 0 || device >= 64)
      return cudaErrorInvalidDevice;
    decode_layers_args b = a;
    b.kv_tile = pick_tile<T>(a, optin);
    if (b.kv_tile == 0)
      return cudaErrorInvalidConfiguration;
    b.timeline = timeline_buffer.load(std::memory_order_relaxed);
    b.prefetch_l2 = layers_prefetch.load(std::memory_order_relaxed);
    const std::size_t shared = shared_bytes(static_cast<std::size_t>(work_layout<T>(b, b.kv_tile).end));
    // The shared memory allowance, raised once per device and type to the most any shape takes
    // (outside CUDA-graph captures: the first call is eager), then checked for this launch.
    static std::atomic<int> opened[64] = {};
    if (opened[device].load(std::memory_order_acquire) == 0) {
      if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - 2048)) != cudaSuccess)
        return e;
      opened[device].store(1, std::memory_order_release);
    }
    int per_sm = 0;
    if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, layers_threads, shared)) != cudaSuccess)
      return e;
    if (per_sm < 1)
      return cudaErrorCooperativeLaunchTooLarge;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(sms));
    config.blockDim = dim3(layers_threads);
    config.dynamicSmemBytes = shared;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeCooperative; // every block resident at once: blocks wait on each other
    attribute[0].val.cooperative = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, kernel, b);
  });
}

} // namespace crucible::policy::kernels
