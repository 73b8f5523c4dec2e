// Split-K decode attention over a dense bf16 or f16 K/V cache on the tensor
// cores: lever tensor_core_attention.
//
// Why: past a few hundred keys the CUDA-core GQA kernel (attention.cu) is bound
// by its instruction chains, not its bytes: each lane carries up to 8 heads'
// dot products, shuffle reductions and online softmax for every key it takes,
// and at 168-238 registers an SM holds two warps a scheduler (ncu, H200,
// Qwen3-30B-A3B at 1k keys: 0.28 instructions issued a cycle a scheduler, DRAM
// 3% busy, 15 us a layer for 2.1 MB). Here a warp's 16 keys take 48 mma for
// head_dim 128 and the softmax costs a few instructions a key.
//
// Precision: q and the softmax weights p enter the mma as pairs of bf16 (f16
// for an f16 cache), hi = round(x) and lo = round(x - hi), each product taken
// twice, so the sums see q and p to about 16 bits; K and V are the cache's own
// values, exact; sums are f32.
//
// Layout: a block takes one kv head, up to 8 of its query heads (rows 0-7 of the
// m16 tiles; rows 8-15 are zero) and one split; its 4 warps take 16-key steps in
// turn, the next step's loads in flight while one is computed. In a warp, lane
// (g, t) = (lane / 4, lane % 4):
//   q.k  m16n8k16 per 16 dims, on two n8 tiles (keys 0-7 and 8-15 of the step):
//        A = q (heads x dims), B = K of the tile's key g, C = scores of head g
//        for the tile's keys 2t, 2t + 1. Lane t holds the dims
//        [HD/4 t, HD/4 (t + 1)) of a key, contiguous: k-step j's slots 2t, 2t+1,
//        2t+8, 2t+9 are its dims HD/4 t + 4j + 0..3, and q is loaded in that order.
//   p.v  m16n8k16 per 16 dims: A = V transposed (dims x the step's keys 2t,
//        2t+1, 2t+8, 2t+9), B = p of head g for those keys (the scores' own
//        registers), C = out of heads 2t, 2t + 1. Lane g holds the dims
//        [HD/8 g, HD/8 (g + 1)) of each key, contiguous: m-tile i's rows g and
//        g + 8 are its dims HD/8 g + 2i and + 1.
// Partials (max, sum, out) per split go to the merge, as the CUDA-core kernel's.
// With lever rope_in_attention the block forms its q rows and the new key's
// rows itself (attention_fresh.cuh), as the CUDA-core kernel does.
#include <climits>
#include <cstdint>

#include "ops/cuda/attention_fresh.cuh"
#include "ops/cuda/attention_mma.h"
#include "ops/cuda/attention_split.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/f16x2.cuh"

namespace mere::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kStepKeys = 16;       // keys a warp takes a step
constexpr int kHeadsPerBlock = kTensorCoreAttentionHeads;  // rows 0-7 of the m16 tiles

// The mma and the f32 -> operand roundings of a cache's element type.
template <typename KV>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  // (lo, hi) rounded to nearest into one word, lo in the low half.
  __device__ static uint32_t pack(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  __device__ static float2 unpack(uint32_t r) {
    return make_float2(__uint_as_float(r << 16), __uint_as_float(r & 0xffff0000u));
  }
  __device__ static void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};
template <>
struct Mma<__half> {
  __device__ static uint32_t pack(float lo, float hi) { return pack_f16x2(lo, hi); }
  __device__ static float2 unpack(uint32_t r) { return unpack_f16x2(r); }
  __device__ static void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

// x0, x1 as the pair of words hi, lo with hi + lo = x to about 16 bits.
template <typename KV>
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  hi = Mma<KV>::pack(x0, x1);
  const float2 h = Mma<KV>::unpack(hi);
  lo = Mma<KV>::pack(x0 - h.x, x1 - h.y);
}

// A step's loads: K of keys g and 8 + g (dims HD/4 t ..), V of keys 2t, 2t+1,
// 2t+8, 2t+9 (dims HD/8 g ..), 8 elements a piece.
template <int HD>
struct StepLoads {
  uint4 k[2][HD / 32];
  uint4 v[4][HD / 64];
};
__device__ __forceinline__ int v_key(int t, int i) { return 2 * t + (i & 1) + 8 * (i >> 1); }
// Word i (two elements) of a lane's pieces; i is a constant once unrolled.
template <int N>
__device__ __forceinline__ uint32_t word(const uint4 (&pieces)[N], int i) {
  const uint4& x = pieces[i / 4];
  return i % 4 == 0 ? x.x : i % 4 == 1 ? x.y : i % 4 == 2 ? x.z : x.w;
}

template <typename KV, int HD, bool kFresh>
__global__ void __launch_bounds__(kWarps * 32, kTensorCoreAttentionBlocksPerSm)
    attention_mma_kernel(const float* __restrict__ q, const KV* __restrict__ k, const KV* __restrict__ v,
                         float* __restrict__ part_m, float* __restrict__ part_l, float* __restrict__ part_o,
                         int n_heads, int n_kv_heads, const int32_t* __restrict__ pos_dev, int64_t pos0, float scale,
                         int n_splits, const __grid_constant__ KvTables tables,
                         const __grid_constant__ FreshArgs<kFresh> fresh, bool rows_final) {
  allow_next_kernel();
  // rows_final: as the CUDA-core kernel, the first step's loads of the rows
  // before this forward's go out before the wait.
  if (!rows_final) wait_for_previous_kernel();
  using M = Mma<KV>;
  constexpr int kSteps = HD / 16;  // k-steps of q.k, m-tiles of p.v

  const int group = n_heads / n_kv_heads, chunks = (group + kHeadsPerBlock - 1) / kHeadsPerBlock;
  const int kv_h = blockIdx.x / chunks, head0 = (blockIdx.x % chunks) * kHeadsPerBlock;
  const int row_t = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int32_t* table = tables.table[tables.rows_are_sequences ? row_t : 0];
  const int first_new = int(pos_dev ? *pos_dev : pos0);
  const int n_keys = first_new + (tables.rows_are_sequences ? 0 : row_t) + 1;
  const int new_key = n_keys - 1;
  const int old_keys_end = rows_final ? first_new : INT_MAX;  // keys from here on are this forward's
  // A grid of fewer splits than the partials (the wide form's, attention.cu)
  // marks the partials past it empty; should a step have keys past it (a graph
  // replayed outside its key counts), its last block takes them: slower, never
  // wrong, as in the CUDA-core kernel.
  KeyRange range = split_range(n_keys, n_splits, split);
  if (split == int(gridDim.z) - 1) range.end = n_keys;
  auto head_ok = [&](int r) { return head0 + r < group; };
  auto slot_of = [&](int r, int s) { return (int64_t(row_t) * n_heads + kv_h * group + head0 + r) * n_splits + s; };
  auto slot = [&](int r) { return slot_of(r, split); };

  using Fresh = FreshRowsInBlock<KV, kHeadsPerBlock, HD, kWarps>;
  __shared__ std::conditional_t<kFresh, typename Fresh::Shared, char> fresh_sh;
  Fresh fresh_rows;

  const int64_t row_stride = int64_t(n_kv_heads) * HD;
  const KV* k_lane = k + int64_t(kv_h) * HD + HD / 4 * t;
  const KV* v_lane = v + int64_t(kv_h) * HD + HD / 8 * g;
  auto clear = [](StepLoads<HD>& L) {
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int p = 0; p < HD / 32; ++p) L.k[n][p] = uint4{};
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int p = 0; p < HD / 64; ++p) L.v[i][p] = uint4{};
  };
  // The step at `base`'s keys in [from, to) and the split: the new key (lever
  // rope_in_attention) from the block's copy, the others from the cache.
  auto fill = [&](int base, StepLoads<HD>& L, int from, int to) {
    auto wanted = [&](int key) { return key >= from && key < to && key < range.end; };
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int key = base + 8 * n + g;
      if (!wanted(key)) continue;
      if (kFresh && key == new_key) {
        if constexpr (kFresh)
#pragma unroll
          for (int p = 0; p < HD / 32; ++p)
            L.k[n][p] = *reinterpret_cast<const uint4*>(&fresh_sh.kv[0][HD / 4 * t + 8 * p]);
      } else {
        const uint4* src = reinterpret_cast<const uint4*>(k_lane + paged_row(table, key) * row_stride);
#pragma unroll
        for (int p = 0; p < HD / 32; ++p) L.k[n][p] = __ldg(src + p);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = base + v_key(t, i);
      if (!wanted(key)) continue;
      if (kFresh && key == new_key) {
        if constexpr (kFresh)
#pragma unroll
          for (int p = 0; p < HD / 64; ++p)
            L.v[i][p] = *reinterpret_cast<const uint4*>(&fresh_sh.kv[1][HD / 8 * g + 8 * p]);
      } else {
        const uint4* src = reinterpret_cast<const uint4*>(v_lane + paged_row(table, key) * row_stride);
#pragma unroll
        for (int p = 0; p < HD / 64; ++p) L.v[i][p] = __ldg(src + p);
      }
    }
  };

  // Loaded before the wait: the old keys, not the new key of a block forming it.
  const int early_end = kFresh ? min(old_keys_end, new_key) : old_keys_end;
  StepLoads<HD> next;
  int base = range.begin + warp * kStepKeys;
  clear(next);
  fill(base, next, 0, early_end);
  if constexpr (kFresh)
    if (rows_final) fresh_rows.prepare(fresh, new_key, HD, fresh_sh);
  wait_for_previous_kernel();  // a no-op when it already waited
  if constexpr (kFresh)
    if (!rows_final) fresh_rows.prepare(fresh, new_key, HD, fresh_sh);
  if (threadIdx.x < kHeadsPerBlock && head_ok(threadIdx.x))
    for (int s = split + int(gridDim.z); s < n_splits; s += int(gridDim.z)) {
      part_m[slot_of(threadIdx.x, s)] = -INFINITY;
      part_l[slot_of(threadIdx.x, s)] = 0;
    }
  if (range.begin >= range.end) {  // a split without keys
    if (threadIdx.x < kHeadsPerBlock && head_ok(threadIdx.x)) {
      part_m[slot(threadIdx.x)] = -INFINITY;
      part_l[slot(threadIdx.x)] = 0;
    }
    return;
  }
  if constexpr (kFresh) {
    const FreshPlace at{row_t, n_heads, n_kv_heads, kv_h, group, head0, HD, new_key, table};
    fresh_rows.form(fresh, at, range.end == n_keys, fresh_sh);
  }
  fill(base, next, early_end, INT_MAX);

  // q of head g (scaled) as hi and lo A operands: k-step j's a0 holds dims
  // HD/4 t + 4j + 0, 1 and a2 dims + 2, 3 (a1, a3: heads 8-15, zero).
  uint32_t qa[kSteps][2][2];  // [j][a0, a2][hi, lo]
  {
    const float* qr = q + (int64_t(row_t) * n_heads + kv_h * group + head0 + g) * HD;
#pragma unroll
    for (int j = 0; j < kSteps; ++j) {
      const int d = HD / 4 * t + 4 * j;  // 4 dims in one 16-byte load
      float4 x = {0, 0, 0, 0};
      if (head_ok(g)) {
        if constexpr (kFresh) x = *reinterpret_cast<const float4*>(&fresh_sh.q[g][Fresh::q_at(d)]);
        else x = *reinterpret_cast<const float4*>(qr + d);
      }
      split_pair<KV>(x.x * scale, x.y * scale, qa[j][0][0], qa[j][0][1]);
      split_pair<KV>(x.z * scale, x.w * scale, qa[j][1][0], qa[j][1][1]);
    }
  }

  // Online softmax of head g (the same in a quad's lanes); out of heads 2t, 2t+1.
  float m_run = -INFINITY, l_run = 0;  // l: this lane's keys only, summed at the end
  float o[kSteps][4] = {};
  for (; base < range.end; base += kWarps * kStepKeys) {
    const StepLoads<HD> cur = next;
    clear(next);
    fill(base + kWarps * kStepKeys, next, 0, INT_MAX);

    float s[2][4] = {};  // [tile][c]: c0, c1 head g keys 2t, 2t+1 of the tile
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int j = 0; j < kSteps; ++j) {
        const uint32_t kb0 = word(cur.k[n], 2 * j), kb1 = word(cur.k[n], 2 * j + 1);
        M::mma(s[n], qa[j][0][0], 0u, qa[j][1][0], 0u, kb0, kb1);
        M::mma(s[n], qa[j][0][1], 0u, qa[j][1][1], 0u, kb0, kb1);
      }
    }
    float score[2][2];
    float step_max = -INFINITY;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        score[n][i] = base + 8 * n + 2 * t + i < range.end ? s[n][i] : -INFINITY;
        step_max = fmaxf(step_max, score[n][i]);
      }
    step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 1));
    step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 2));
    const float m_new = fmaxf(m_run, step_max);
    const float ref = m_new == -INFINITY ? 0.0f : m_new;
    const float correction = __expf(m_run - ref);
    float p[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int i = 0; i < 2; ++i) p[n][i] = __expf(score[n][i] - ref);
    m_run = m_new;
    l_run = l_run * correction + ((p[0][0] + p[0][1]) + (p[1][0] + p[1][1]));
    // Rescale only when some head's maximum moved.
    if (!__all_sync(0xffffffffu, correction == 1.0f)) {
      const float ca = __shfl_sync(0xffffffffu, correction, 8 * t);      // head 2t
      const float cb = __shfl_sync(0xffffffffu, correction, 8 * t + 4);  // head 2t + 1
#pragma unroll
      for (int i = 0; i < kSteps; ++i) o[i][0] *= ca, o[i][1] *= cb, o[i][2] *= ca, o[i][3] *= cb;
    }
    uint32_t b0[2], b1[2];  // [hi, lo]: keys 2t, 2t+1 (tile 0) and 2t+8, 2t+9 (tile 1)
    split_pair<KV>(p[0][0], p[0][1], b0[0], b0[1]);
    split_pair<KV>(p[1][0], p[1][1], b1[0], b1[1]);
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      // Word i of each key's piece: dims HD/8 g + 2i (low half) and + 1 (high).
      uint32_t w[4];
#pragma unroll
      for (int key = 0; key < 4; ++key) w[key] = word(cur.v[key], i);
      const uint32_t a0 = __byte_perm(w[0], w[1], 0x5410), a1 = __byte_perm(w[0], w[1], 0x7632);
      const uint32_t a2 = __byte_perm(w[2], w[3], 0x5410), a3 = __byte_perm(w[2], w[3], 0x7632);
      M::mma(o[i], a0, a1, a2, a3, b0[0], b1[0]);
      M::mma(o[i], a0, a1, a2, a3, b0[1], b1[1]);
    }
  }

  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  __shared__ float warp_m[kWarps][kHeadsPerBlock], warp_l[kWarps][kHeadsPerBlock];
  // Padded rows: the quads' 8-byte stores meet 4-way bank conflicts, not the
  // 16-way ones of rows of HD floats.
  __shared__ __align__(16) float warp_o[kWarps][kHeadsPerBlock][kPaddedWarpORow<HD>];
  if (t == 0) warp_m[warp][g] = m_run, warp_l[warp][g] = l_run;
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
    const int d = HD / 8 * g + 2 * i;
    *reinterpret_cast<float2*>(&warp_o[warp][2 * t][d]) = make_float2(o[i][0], o[i][2]);
    *reinterpret_cast<float2*>(&warp_o[warp][2 * t + 1][d]) = make_float2(o[i][1], o[i][3]);
  }
  __syncthreads();
  write_block_partials<HD>(warp_m, warp_l, warp_o, HD, head_ok, slot, part_m, part_l, part_o);
}

}  // namespace

template <typename KV, int HD, bool kFresh>
cudaError_t launch_attention_mma(const float* q, const KV* k, const KV* v, float* part_m, float* part_l,
                                 float* part_o, int T, int n_heads, int n_kv_heads, const int32_t* pos_dev,
                                 int64_t pos0, int n_splits, int grid_splits, float scale, const KvTables& tables,
                                 cudaStream_t stream, const FreshArgs<kFresh>& fresh, bool rows_final) {
  const int chunks = (n_heads / n_kv_heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  return launch_kernel(attention_mma_kernel<KV, HD, kFresh>, dim3(n_kv_heads * chunks, T, grid_splits), kWarps * 32,
                       0, stream, q, k, v, part_m, part_l, part_o, n_heads, n_kv_heads, pos_dev, pos0, scale,
                       n_splits, tables, fresh, rows_final);
}

#define MERE_ATTENTION_MMA(KV, HD, FRESH)                                                                         \
  template cudaError_t launch_attention_mma<KV, HD, FRESH>(const float*, const KV*, const KV*, float*, float*,  \
                                                           float*, int, int, int, const int32_t*, int64_t, int, int, \
                                                           float, const KvTables&, cudaStream_t,                \
                                                           const FreshArgs<FRESH>&, bool);
MERE_ATTENTION_MMA(__nv_bfloat16, 64, false)
MERE_ATTENTION_MMA(__nv_bfloat16, 64, true)
MERE_ATTENTION_MMA(__nv_bfloat16, 128, false)
MERE_ATTENTION_MMA(__nv_bfloat16, 128, true)
MERE_ATTENTION_MMA(__half, 64, false)
MERE_ATTENTION_MMA(__half, 64, true)
MERE_ATTENTION_MMA(__half, 128, false)
MERE_ATTENTION_MMA(__half, 128, true)
#undef MERE_ATTENTION_MMA

}  // namespace mere::cuda
