// Causal GQA attention as split-K flash decoding, for decode and prefill.
// Each split of the keys a token sees gives one partial (max, sum, out) per query
// head; a second kernel merges the splits, or, where a head's few splits run as
// one thread-block cluster (lever cluster_attention_merge), they merge each
// other's partials through distributed shared memory. A split holds
// max(kMinKeysPerSplit, ceil(visible keys / n_splits)) keys, worked out in the
// kernel from the position, so a graph captured with a fixed n_splits stays right
// as the context grows, short contexts use few splits and long ones spread over
// all of them. A split past the visible keys writes max -inf and sum 0 (its out
// is left unwritten; the merge skips it).
// The GQA kernel also reads groupwise affine caches (KV modes affine8/affine4):
// it loads the codes and each group's bf16 scale and bias and dequantizes in
// registers; no dequantized copy of the cache exists. By default (lever
// tensor_core_kv_attention) launch_attention_affine runs the tensor-core kernel
// of attention_affine_mma.cu instead, where it applies (head_dim 64 or 128).
// Over dense bf16/f16 caches past 1,024 keys (lever tensor_core_attention) both
// forms give way to the tensor-core kernel of attention_mma.cu.
// Paged caches (KvTables): key s is read from row table[s / 16] * 16 + s % 16, so
// a key's lanes still read one contiguous row; in a batch (rows_are_sequences)
// grid.y indexes the sequence, each reading its own table, all at *pos.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include <cooperative_groups.h>

#include "ops/cuda/attention_fresh.cuh"
#include "ops/cuda/attention_mma.h"
#include "ops/cuda/attention_split.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/kv_quant.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

constexpr int kWarps = 4;

// ---------------------------------------------------------------------------
// GQA kernel, for decode and prefill alike whenever the K/V rows allow aligned
// 16-byte loads (head_dim a multiple of 16 bytes, 16-byte aligned bases).
//
// Grid (kv head x chunk of HB query heads, token or sequence, split), NW warps
// (4, or 8 for short contexts: lever wide_attention_blocks, below). The block walks
// its split once for the HB query heads that share the kv head, so each K/V byte
// is read from memory once per token rather than once per query head (short
// contexts' blocks of fewer heads read it once per block, from L2). A sub-group
// of L lanes takes one key: each lane loads 16-byte pieces of the key's K and V
// rows (E = head_dim_bucket / L elements), holds q and the output accumulator for
// those elements for all HB heads, and the partial dot products meet in log2(L)
// shuffles. A sub-group takes KPI keys per step, with the next step's K/V loads in
// flight, and updates its online softmax once per step. At the end the sub-groups
// of a warp merge by shuffles, the four warps through shared memory.

// How a cache stores its rows: dense rows of KV elements (f32, bf16, f16), read
// in 16-byte pieces, or Affine<bits> codes, read in pieces of 8 codes (8 or 4
// bytes) so that a lane holds as many elements as with bf16, plus the bf16
// scale and bias of the piece's group. A piece never straddles a group (groups
// are multiples of 8 elements).
template <int kBits>
struct Affine {};

template <typename KV>
struct Storage {
  using Unit = KV;      // what the row pointers point at
  using Piece = uint4;  // one load
  static constexpr int W = 16 / int(sizeof(KV));  // elements per piece
  static constexpr bool quantized = false;
  __device__ static int64_t units(int64_t elements) { return elements; }
};
template <>
struct Storage<Affine<8>> {
  using Unit = uint8_t;
  using Piece = uint2;
  static constexpr int W = 8;
  static constexpr bool quantized = true;
  __device__ static int64_t units(int64_t elements) { return elements; }
};
template <>
struct Storage<Affine<4>> {
  using Unit = uint8_t;
  using Piece = uint32_t;
  static constexpr int W = 8;
  static constexpr bool quantized = true;
  __device__ static int64_t units(int64_t elements) { return elements / 2; }
};

// Per-group scales and biases of the K and V codes (quantized storage only).
struct AffineGroups {
  const uint16_t *k_scales = nullptr, *k_biases = nullptr, *v_scales = nullptr, *v_biases = nullptr;
  int group = 0;  // elements per group
};

template <typename KV, int HD, int NW = kWarps>
struct Lanes {
  static constexpr int W = Storage<KV>::W;                       // elements per load
  static constexpr int L = HD / W < 32 ? HD / W : 32;           // lanes per key
  static constexpr int C = HD / (L * W);                        // 16-byte pieces per lane
  static constexpr int E = C * W;                               // elements per lane
  static constexpr int kSubgroups = NW * 32 / L;
  static_assert(HD % (L * W) == 0 && 32 % L == 0);
};

// Piece c of a lane covers elements [(c * L + lane) * W, +W) of a row.
template <typename KV, int HD>
__device__ __forceinline__ int piece_offset(int c, int sub_lane) {
  using S = Lanes<KV, HD>;
  return (c * S::L + sub_lane) * S::W;
}

template <typename KV>
__device__ __forceinline__ void unpack(const uint4& r, float* f);

template <>
__device__ __forceinline__ void unpack<float>(const uint4& r, float* f) {
  f[0] = __uint_as_float(r.x), f[1] = __uint_as_float(r.y), f[2] = __uint_as_float(r.z), f[3] = __uint_as_float(r.w);
}

// The element at the lower address is the low half of each 32-bit word.
template <>
__device__ __forceinline__ void unpack<__nv_bfloat16>(const uint4& r, float* f) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

template <>
__device__ __forceinline__ void unpack<__half>(const uint4& r, float* f) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] & 0xffffu)));
    f[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] >> 16)));
  }
}

// Eight codes to scale * code + bias. A code c becomes the float 2^23 + c by
// placing it in the mantissa of 2^23, then exactly c by subtracting 2^23.
__device__ __forceinline__ float byte_code(uint32_t w, int i) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | unsigned(i))) - 8388608.0f;
}
__device__ __forceinline__ float nibble_code(uint32_t w, int i) {
  return __uint_as_float(0x4B000000u | ((w >> (4 * i)) & 0xfu)) - 8388608.0f;
}
__device__ __forceinline__ void unpack_affine(const uint2& r, uint16_t scale, uint16_t bias, float* f) {
  const float s = bf16_value(scale), b = bf16_value(bias);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[i] = fmaf(byte_code(r.x, i), s, b);
    f[4 + i] = fmaf(byte_code(r.y, i), s, b);
  }
}
__device__ __forceinline__ void unpack_affine(const uint32_t& r, uint16_t scale, uint16_t bias, float* f) {
  const float s = bf16_value(scale), b = bf16_value(bias);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = fmaf(nibble_code(r, i), s, b);
}

// Keys per sub-group per step: loads in flight (two steps' worth, 2 x KPI x C x
// 32 bytes per lane) against the q and out registers (HB x E each).
template <int HB, int C>
constexpr int kKeysPerStep = (HB >= 8 ? 2 : 4) / C;
// Blocks per SM to fit in registers: with 4 warps three up to four heads (at
// most 170 registers a thread), one for eight (up to 255); with 8 warps one. Left to itself ptxas sometimes
// spills a few words to fit an occupancy of its own choosing.
template <int HB, int NW>
constexpr int kMinBlocksPerSm = HB >= 8 ? 1 : 12 / NW;

// Lever cluster_attention_merge: the grid's splits of one (kv head, head chunk,
// row) are one cluster. Each block leaves its partial in its shared memory; after
// a cluster barrier the blocks share out the HB heads' columns, each reading every
// split's partial through distributed shared memory, and write the output divided
// by the sum, so no merge kernel runs. The second barrier keeps every block's
// shared memory alive until the others have read it.
template <int NW, int HB, int HD, typename HeadOk>
__device__ __forceinline__ void merge_in_cluster(const float (&warp_m)[NW][HB], const float (&warp_l)[NW][HB],
                                                 const float (&warp_o)[NW][HB][HD], int head_dim, HeadOk head_ok,
                                                 float* out) {
  __shared__ float block_m[HB], block_l[HB];
  __shared__ __align__(16) float block_o[HB * HD];
  write_block_partials<HD>(warp_m, warp_l, warp_o, head_dim, head_ok, [](int r) { return int64_t(r); }, block_m,
                       block_l, block_o);
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int splits = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  if (splits == 1) {  // one split: its output, without the cluster barriers' fences
    __syncthreads();
    for (int i = threadIdx.x; i < HB * head_dim; i += blockDim.x) {
      const int r = i / head_dim;
      if (head_ok(r)) out[i] = block_o[i] / block_l[r];
    }
    return;
  }
  cluster.sync();
  for (int i = rank * int(blockDim.x) + int(threadIdx.x); i < HB * head_dim; i += splits * int(blockDim.x)) {
    const int r = i / head_dim, d = i % head_dim;
    if (!head_ok(r)) continue;
    float m = -INFINITY;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, cluster.map_shared_rank(block_m, s)[r]);
    float sum = 0, acc = 0;
    for (int s = 0; s < splits; ++s) {
      const float ms = cluster.map_shared_rank(block_m, s)[r];
      if (ms == -INFINITY) continue;  // a split without keys
      const float a = __expf(ms - m);
      sum += cluster.map_shared_rank(block_l, s)[r] * a;
      acc += cluster.map_shared_rank(block_o, s)[r * head_dim + d] * a;
    }
    out[int64_t(r) * head_dim + d] = acc / sum;
  }
  cluster.sync();
}

template <typename KV, int HD, int HB, bool kFresh, int NW>
__global__ void __launch_bounds__(NW * 32, kMinBlocksPerSm<HB, NW>)
    attention_gqa_kernel(const float* __restrict__ q, const typename Storage<KV>::Unit* __restrict__ k,
                         const typename Storage<KV>::Unit* __restrict__ v, const AffineGroups groups,
                         float* __restrict__ part_m, float* __restrict__ part_l, float* __restrict__ part_o,
                         float* __restrict__ merged, int n_heads, int n_kv_heads, int head_dim,
                         const int32_t* __restrict__ pos_dev, int64_t pos0, float scale, int n_splits,
                         const __grid_constant__ KvTables tables, const __grid_constant__ FreshArgs<kFresh> fresh,
                         bool rows_final) {
  allow_next_kernel();
  // rows_final (a decode step, ops::set_cached_rows_final): the position and
  // the cache rows before it were final before the forward's first kernel
  // started, so the first step's loads of those rows go out before the wait,
  // during the kernels before this one. Otherwise everything waits.
  if (!rows_final) wait_for_previous_kernel();
  using S = Lanes<KV, HD, NW>;
  using St = Storage<KV>;
  using Piece = typename St::Piece;
  constexpr int L = S::L, C = S::C, W = S::W, E = S::E;
  constexpr int KPI = kKeysPerStep<HB, C>;
  constexpr int kStep = S::kSubgroups * KPI;

  const int group = n_heads / n_kv_heads, chunks = (group + HB - 1) / HB;
  const int kv_h = blockIdx.x / chunks, head0 = (blockIdx.x % chunks) * HB;  // head0: index within the group
  const int t = blockIdx.y, split = blockIdx.z;  // t: the row of q
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int subgroup = threadIdx.x / L, sub_lane = threadIdx.x % L;
  const int32_t* table = tables.table[tables.rows_are_sequences ? t : 0];

  const int first_new = int(pos_dev ? *pos_dev : pos0);  // the forward's first position: rows before it are old
  const int n_keys = first_new + (tables.rows_are_sequences ? 0 : t) + 1;
  // A wide grid (lever wide_attention_blocks) may hold fewer splits than the
  // partials, the rest past the keys. Should a step have keys past the grid (a
  // graph replayed outside the key counts it was captured for), its last block
  // takes them all: slower, never wrong.
  KeyRange range = split_range(n_keys, n_splits, split);
  if (split == int(gridDim.z) - 1) range.end = n_keys;
  auto head_ok = [&](int g) { return head0 + g < group; };
  auto slot_of = [&](int g, int s) { return (int64_t(t) * n_heads + kv_h * group + head0 + g) * n_splits + s; };
  auto slot = [&](int g) { return slot_of(g, split); };
  const int new_key = n_keys - 1;
  // Keys from old_keys_end on were (or are being) written by this forward's kernels.
  const int old_keys_end = rows_final ? first_new : INT_MAX;

  // Block `split` marks the partials' splits past the grid, split + j * gridDim.z, empty,
  // and a split with no keys its own (after the wait).
  auto mark_empty_splits = [&] {
    if (!merged && threadIdx.x < HB && head_ok(threadIdx.x)) {
      for (int s = split + int(gridDim.z); s < n_splits; s += int(gridDim.z)) {
        part_m[slot_of(threadIdx.x, s)] = -INFINITY;
        part_l[slot_of(threadIdx.x, s)] = 0;
      }
      if (range.begin >= range.end) {
        part_m[slot(threadIdx.x)] = -INFINITY;
        part_l[slot(threadIdx.x)] = 0;
      }
    }
  };

  // Lever rope_in_attention (attention_fresh.cuh): the block's q rows, and in the
  // split holding the new key its k and v rows, normalised and rotated into
  // shared memory (head chunk 0 also writing k and v to the cache); the loop
  // below takes the new key from there, the same bits it would have loaded. The
  // first step's K/V loads are issued before this; the angles are computed once a block.
  using Fresh = FreshRowsInBlock<KV, HB, HD, NW>;
  __shared__ std::conditional_t<kFresh, typename Fresh::Shared, char> fresh_sh;
  Fresh fresh_rows;
  auto prepare_norm_and_angles = [&] {
    if constexpr (kFresh) fresh_rows.prepare(fresh, new_key, head_dim, fresh_sh);
  };
  auto prepare_fresh = [&] {
    if constexpr (kFresh) {
      static_assert(!St::quantized, "rope_in_attention writes dense caches only");
      const FreshPlace at{t, n_heads, n_kv_heads, kv_h, group, head0, head_dim, new_key, table};
      fresh_rows.form(fresh, at, range.begin < range.end && range.end == n_keys, fresh_sh);
    }
  };

  // q (scaled) for this lane's elements; heads past the group and elements past
  // head_dim are 0 and take no part.
  float qv[HB][E], o[HB][E], m[HB], l[HB];
  auto load_q = [&] {
#pragma unroll
    for (int g = 0; g < HB; ++g) {
      const float* qr = q + (int64_t(t) * n_heads + kv_h * group + head0 + g) * head_dim;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int j0 = piece_offset<KV, HD>(c, sub_lane);
        if constexpr (kFresh) {
          // A piece of W (a multiple of 4, dividing 32) lies within one padded run
          // of sh.q, and a dense cache's pieces lie wholly within head_dim: W / 4
          // 16-byte loads.
          static_assert(W % 4 == 0 && 32 % W == 0);
          const bool used = head_ok(g) && j0 < head_dim;
#pragma unroll
          for (int w = 0; w < W; w += 4) {
            const float4 x = used ? *reinterpret_cast<const float4*>(&fresh_sh.q[g][Fresh::q_at(j0 + w)])
                                  : make_float4(0, 0, 0, 0);
            float* dst = &qv[g][c * W + w];
            dst[0] = x.x * scale, dst[1] = x.y * scale, dst[2] = x.z * scale, dst[3] = x.w * scale;
          }
        } else {
#pragma unroll
          for (int w = 0; w < W; ++w) {
            const int j = j0 + w;
            qv[g][c * W + w] = head_ok(g) && j < head_dim ? qr[j] * scale : 0.0f;
          }
        }
      }
    }
  };
#pragma unroll
  for (int g = 0; g < HB; ++g) {
#pragma unroll
    for (int e = 0; e < E; ++e) o[g][e] = 0;
    m[g] = -INFINITY;
    l[g] = 0;
  }

  // Loads of the KPI keys of one step; keys past the split and pieces past
  // head_dim read nothing and unpack as 0 (quantized: scale and bias 0).
  const int64_t row_stride = int64_t(n_kv_heads) * head_dim;  // elements
  const typename St::Unit* k_lane = k + St::units(int64_t(kv_h) * head_dim);
  const typename St::Unit* v_lane = v + St::units(int64_t(kv_h) * head_dim);
  bool piece_ok[C];
#pragma unroll
  for (int c = 0; c < C; ++c) piece_ok[c] = piece_offset<KV, HD>(c, sub_lane) < head_dim;
  // Quantized: the group of each piece, and the index of (key 0, kv_h, group 0).
  const int groups_per_head = St::quantized ? head_dim / groups.group : 0;
  int piece_group[C];
#pragma unroll
  for (int c = 0; c < C; ++c) piece_group[c] = St::quantized ? piece_offset<KV, HD>(c, sub_lane) / groups.group : 0;
  // Scale and bias of K and V per key and piece (unused for dense storage).
  struct Groups {
    uint16_t ks, kb, vs, vb;
  };
  // The storage rows of the keys a sub-group takes in the step at `base`. They
  // are looked up a step before their K/V loads are issued, so a paged cache's
  // table load is not on the loads' critical path.
  auto rows_at = [&](int base, int (&rows)[KPI]) {
#pragma unroll
    for (int j = 0; j < KPI; ++j) {
      const int s = base + j * S::kSubgroups + subgroup;
      rows[j] = s < range.end ? int(paged_row(table, s)) : 0;
    }
  };
  // Piece c of the new key's k and v from the block's copy (lever rope_in_attention).
  auto take_fresh = [&](int c, Piece& kr, Piece& vr) {
    if constexpr (kFresh) {
      kr = *reinterpret_cast<const Piece*>(&fresh_sh.kv[0][piece_offset<KV, HD>(c, sub_lane)]);
      vr = *reinterpret_cast<const Piece*>(&fresh_sh.kv[1][piece_offset<KV, HD>(c, sub_lane)]);
    }
  };
  // Piece c of the key in storage row `row` from the cache.
  auto load_piece = [&](int64_t row, int c, Piece& kr, Piece& vr, Groups& gr) {
    const int64_t off = St::units(row * row_stride + piece_offset<KV, HD>(c, sub_lane));
    kr = __ldg(reinterpret_cast<const Piece*>(k_lane + off));
    vr = __ldg(reinterpret_cast<const Piece*>(v_lane + off));
    if constexpr (St::quantized) {
      const int64_t g = (row * n_kv_heads + kv_h) * groups_per_head + piece_group[c];
      gr = Groups{__ldg(groups.k_scales + g), __ldg(groups.k_biases + g), __ldg(groups.v_scales + g),
                  __ldg(groups.v_biases + g)};
    }
  };
  // fresh_ready: the block holds the new key's rows (lever rope_in_attention); before
  // that, the new key's pieces are left 0 and loaded again once it is. Keys
  // from `newer` on are left 0 too (loaded by load_newer after the wait).
  auto load = [&](int base, const int (&rows)[KPI], Piece (&kr)[KPI][C], Piece (&vr)[KPI][C], Groups (&gr)[KPI][C],
                  bool fresh_ready = true, int newer = INT_MAX) {
#pragma unroll
    for (int j = 0; j < KPI; ++j) {
      const int s = base + j * S::kSubgroups + subgroup;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        kr[j][c] = vr[j][c] = Piece{};
        gr[j][c] = Groups{0, 0, 0, 0};  // dense storage: never read, optimised away
        if (kFresh && s == new_key && s < range.end) {  // the new key, from the block's own copy
          if (fresh_ready && piece_ok[c]) take_fresh(c, kr[j][c], vr[j][c]);
        } else if (s < range.end && s < newer && piece_ok[c]) {
          load_piece(rows[j], c, kr[j][c], vr[j][c], gr[j][c]);
        }
      }
    }
  };
  auto load_newer = [&](int base, const int (&rows)[KPI], Piece (&kr)[KPI][C], Piece (&vr)[KPI][C],
                        Groups (&gr)[KPI][C], int newer) {
#pragma unroll
    for (int j = 0; j < KPI; ++j) {
      const int s = base + j * S::kSubgroups + subgroup;
      if (s < newer || s >= range.end || (kFresh && s == new_key)) continue;
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (piece_ok[c]) load_piece(rows[j], c, kr[j][c], vr[j][c], gr[j][c]);
    }
  };
  auto unpack_piece = [&](const Piece& r, uint16_t group_scale, uint16_t group_bias, float* f) {
    if constexpr (St::quantized) unpack_affine(r, group_scale, group_bias, f);
    else unpack<KV>(r, f);
  };

  Piece k_next[KPI][C], v_next[KPI][C];
  Groups g_next[KPI][C];
  int rows[KPI];
  rows_at(range.begin, rows);
  load(range.begin, rows, k_next, v_next, g_next, /*fresh_ready=*/false, old_keys_end);
  if (rows_final) prepare_norm_and_angles();
  wait_for_previous_kernel();  // a no-op when it already waited
  if (!rows_final) prepare_norm_and_angles();
  mark_empty_splits();
  // A split without keys leaves; in a cluster (lever cluster_attention_merge) it
  // stays for the merge, with max -inf and sum 0.
  if (range.begin >= range.end && !merged) return;
  if (rows_final) load_newer(range.begin, rows, k_next, v_next, g_next, old_keys_end);
  if constexpr (kFresh) {
    prepare_fresh();
#pragma unroll
    for (int j = 0; j < KPI; ++j) {  // the first step's new key, from the copy now made
      const int s = range.begin + j * S::kSubgroups + subgroup;
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (s == new_key && s < range.end && piece_ok[c]) take_fresh(c, k_next[j][c], v_next[j][c]);
    }
  }
  load_q();  // q is the kernel before this one's output
  rows_at(range.begin + kStep, rows);
  // The loop bounds are the same for every thread of the block, so every lane
  // reaches every shuffle.
  for (int base = range.begin; base < range.end; base += kStep) {
    Piece k_cur[KPI][C], v_cur[KPI][C];
    Groups g_cur[KPI][C];
#pragma unroll
    for (int j = 0; j < KPI; ++j)
#pragma unroll
      for (int c = 0; c < C; ++c) {
        k_cur[j][c] = k_next[j][c], v_cur[j][c] = v_next[j][c];
        g_cur[j][c] = g_next[j][c];
      }
    load(base + kStep, rows, k_next, v_next, g_next);
    rows_at(base + 2 * kStep, rows);

    float score[KPI][HB];
#pragma unroll
    for (int j = 0; j < KPI; ++j) {
      float kf[E];
#pragma unroll
      for (int c = 0; c < C; ++c) unpack_piece(k_cur[j][c], g_cur[j][c].ks, g_cur[j][c].kb, kf + c * W);
#pragma unroll
      for (int g = 0; g < HB; ++g) {
        float dot = 0;
#pragma unroll
        for (int e = 0; e < E; ++e) dot = fmaf(qv[g][e], kf[e], dot);
        score[j][g] = dot;
      }
    }
    // Sum over the sub-group: xor offsets below L stay inside it.
#pragma unroll
    for (int off = L / 2; off > 0; off /= 2)
#pragma unroll
      for (int j = 0; j < KPI; ++j)
#pragma unroll
        for (int g = 0; g < HB; ++g) score[j][g] += __shfl_xor_sync(0xffffffffu, score[j][g], off);

    float p[KPI][HB];
#pragma unroll
    for (int g = 0; g < HB; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int j = 0; j < KPI; ++j) {
        if (base + j * S::kSubgroups + subgroup >= range.end) score[j][g] = -INFINITY;
        m_new = fmaxf(m_new, score[j][g]);
      }
      const float ref = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: every weight is exp(-inf) = 0
      const float correction = __expf(m[g] - ref);
      float sum = 0;
#pragma unroll
      for (int j = 0; j < KPI; ++j) {
        p[j][g] = __expf(score[j][g] - ref);
        sum += p[j][g];
      }
      l[g] = l[g] * correction + sum;
      m[g] = m_new;
#pragma unroll
      for (int e = 0; e < E; ++e) o[g][e] *= correction;
    }
#pragma unroll
    for (int j = 0; j < KPI; ++j) {
      float vf[E];
#pragma unroll
      for (int c = 0; c < C; ++c) unpack_piece(v_cur[j][c], g_cur[j][c].vs, g_cur[j][c].vb, vf + c * W);
#pragma unroll
      for (int g = 0; g < HB; ++g)
#pragma unroll
        for (int e = 0; e < E; ++e) o[g][e] = fmaf(p[j][g], vf[e], o[g][e]);
    }
  }

  // Merge the sub-groups of each warp (lanes L apart hold the same elements).
#pragma unroll
  for (int off = L; off < 32; off *= 2)
#pragma unroll
    for (int g = 0; g < HB; ++g) {
      const float m_other = __shfl_xor_sync(0xffffffffu, m[g], off);
      const float l_other = __shfl_xor_sync(0xffffffffu, l[g], off);
      const float m_new = fmaxf(m[g], m_other);
      const float a = rescale(m[g], m_new), b = rescale(m_other, m_new);
      l[g] = l[g] * a + l_other * b;
#pragma unroll
      for (int e = 0; e < E; ++e) o[g][e] = o[g][e] * a + __shfl_xor_sync(0xffffffffu, o[g][e], off) * b;
      m[g] = m_new;
    }

  // Merge the warps: rescale each to the block maximum.
  __shared__ float warp_m[NW][HB], warp_l[NW][HB];
  __shared__ __align__(16) float warp_o[NW][HB][HD];
  if (lane < L) {
#pragma unroll
    for (int g = 0; g < HB; ++g) {
      if (lane == 0) warp_m[warp][g] = m[g], warp_l[warp][g] = l[g];
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int w = 0; w < W; ++w) warp_o[warp][g][piece_offset<KV, HD>(c, lane) + w] = o[g][c * W + w];
    }
  }
  __syncthreads();
  if (merged)
    merge_in_cluster<NW, HB, HD>(warp_m, warp_l, warp_o, head_dim, head_ok,
                                 merged + (int64_t(t) * n_heads + kv_h * group + head0) * head_dim);
  else
    write_block_partials<HD>(warp_m, warp_l, warp_o, head_dim, head_ok, slot, part_m, part_l, part_o);
}

// ---------------------------------------------------------------------------
// Fallback kernel, for K/V rows that 16-byte loads cannot take (head_dim not a
// multiple of 16 bytes, or an unaligned base). Grid (query head, row, split):
// each block walks one split, its four warps taking every fourth key, each lane
// holding head_dim / 32 elements, with an online softmax; the warps merge in
// shared memory.
constexpr int kMaxPerLane = kMaxAttentionHeadDim / 32;

template <typename KV>
__global__ void __launch_bounds__(kWarps * 32)
    attention_split_kernel(const float* __restrict__ q, const KV* __restrict__ k, const KV* __restrict__ v,
                           float* __restrict__ part_m, float* __restrict__ part_l, float* __restrict__ part_o,
                           int n_heads, int n_kv_heads, int head_dim, const int32_t* __restrict__ pos_dev,
                           int64_t pos0, float scale, int n_splits, const __grid_constant__ KvTables tables) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int h = blockIdx.x, t = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kv_h = h / (n_heads / n_kv_heads);
  const int32_t* table = tables.table[tables.rows_are_sequences ? t : 0];
  const int n_keys = int((pos_dev ? *pos_dev : pos0) + (tables.rows_are_sequences ? 0 : t) + 1);
  const KeyRange range = split_range(n_keys, n_splits, split);
  const int64_t slot = (int64_t(t) * n_heads + h) * n_splits + split;
  if (range.begin >= range.end) {
    if (threadIdx.x == 0) {
      part_m[slot] = -INFINITY;
      part_l[slot] = 0;
    }
    return;
  }

  float qv[kMaxPerLane], o[kMaxPerLane];
  const float* qr = q + (int64_t(t) * n_heads + h) * head_dim;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    int j = lane + 32 * i;
    qv[i] = j < head_dim ? qr[j] * scale : 0.0f;
    o[i] = 0;
  }
  float m = -INFINITY, l = 0;
  for (int64_t s = range.begin + warp; s < range.end; s += kWarps) {
    const int64_t row = paged_row(table, s);
    const KV* kr = k + (row * n_kv_heads + kv_h) * head_dim;
    float dot = 0;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      int j = lane + 32 * i;
      if (j < head_dim) dot += qv[i] * to_float(kr[j]);
    }
    float score = warp_sum(dot);
    float m_new = fmaxf(m, score);
    float correction = __expf(m - m_new), p = __expf(score - m_new);
    l = l * correction + p;
    const KV* vr = v + (row * n_kv_heads + kv_h) * head_dim;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      int j = lane + 32 * i;
      if (j < head_dim) o[i] = o[i] * correction + p * to_float(vr[j]);
    }
    m = m_new;
  }

  __shared__ float warp_m[kWarps], warp_l[kWarps];
  __shared__ float warp_o[kWarps][kMaxPerLane * 32];
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) warp_o[warp][lane + 32 * i] = o[i];
  __syncthreads();
  float block_m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) block_m = fmaxf(block_m, warp_m[w]);
  for (int j = threadIdx.x; j < head_dim; j += blockDim.x) {
    float acc = 0;
    for (int w = 0; w < kWarps; ++w)
      if (warp_m[w] != -INFINITY) acc += warp_o[w][j] * __expf(warp_m[w] - block_m);
    part_o[slot * head_dim + j] = acc;
  }
  if (threadIdx.x == 0) {
    float sum = 0;
    for (int w = 0; w < kWarps; ++w)
      if (warp_m[w] != -INFINITY) sum += warp_l[w] * __expf(warp_m[w] - block_m);
    part_m[slot] = block_m;
    part_l[slot] = sum;
  }
}

// One block per (token, head): the threads find the largest split max and the
// total sum together, then rows of threads, one column per element, each sum a
// share of the splits, and the rows meet in shared memory. A split that saw no
// key has max -inf and no out, and is skipped.
constexpr int kMergeThreads = 256;

__global__ void __launch_bounds__(kMergeThreads)
    attention_merge_kernel(const float* __restrict__ part_m, const float* __restrict__ part_l,
                           const float* __restrict__ part_o, float* __restrict__ out, int n_heads, int head_dim,
                           int n_splits) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int h = blockIdx.x, t = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t base = (int64_t(t) * n_heads + h) * n_splits;
  __shared__ float warp_part[kMergeThreads / 32];
  __shared__ float row_acc[kMergeThreads];
  const int cols = min(kMergeThreads, (head_dim + 31) / 32 * 32), rows = kMergeThreads / cols;
  const int row = threadIdx.x / cols, col = threadIdx.x % cols;

  // Loaded before anything is reduced, so that no read waits for a reduction:
  // split threadIdx.x's max and sum, and the first kEarly of this thread's
  // splits' maxima and outputs (column col). The sums below add the same terms
  // in the same order as loading each where it is used.
  const bool first = int(threadIdx.x) < n_splits;
  const float first_m = first ? part_m[base + threadIdx.x] : -INFINITY;
  const float first_l = first ? part_l[base + threadIdx.x] : 0.0f;
  constexpr int kEarly = 16;
  float early_m[kEarly], early_o[kEarly];
#pragma unroll
  for (int i = 0; i < kEarly; ++i) {
    const int s = row + i * rows;
    const bool ok = row < rows && col < head_dim && s < n_splits;
    early_m[i] = ok ? part_m[base + s] : -INFINITY;
    early_o[i] = ok ? part_o[(base + s) * head_dim + col] : 0.0f;
  }

  float m = fmaxf(-INFINITY, first_m);
  for (int s = threadIdx.x + kMergeThreads; s < n_splits; s += kMergeThreads) m = fmaxf(m, part_m[base + s]);
  m = warp_max(m);
  if (lane == 0) warp_part[warp] = m;
  __syncthreads();
  m = -INFINITY;
  for (int w = 0; w < kMergeThreads / 32; ++w) m = fmaxf(m, warp_part[w]);
  __syncthreads();

  float l = 0;
  if (first_m != -INFINITY) l += first_l * __expf(first_m - m);
  for (int s = threadIdx.x + kMergeThreads; s < n_splits; s += kMergeThreads)
    if (part_m[base + s] != -INFINITY) l += part_l[base + s] * __expf(part_m[base + s] - m);
  l = warp_sum(l);
  if (lane == 0) warp_part[warp] = l;
  __syncthreads();
  l = 0;
  for (int w = 0; w < kMergeThreads / 32; ++w) l += warp_part[w];

  for (int j0 = 0; j0 < head_dim; j0 += cols) {  // one pass: head_dim <= kMaxAttentionHeadDim = kMergeThreads
    const int j = j0 + col;
    float acc = 0;
    if (row < rows && j < head_dim) {
      int s = row;
      if (j0 == 0) {
#pragma unroll
        for (int i = 0; i < kEarly; ++i, s += rows)
          if (early_m[i] != -INFINITY) acc += early_o[i] * __expf(early_m[i] - m);
      }
#pragma unroll 4
      for (; s < n_splits; s += rows) {
        const float ms = part_m[base + s];
        if (ms != -INFINITY) acc += part_o[(base + s) * head_dim + j] * __expf(ms - m);
      }
    }
    row_acc[threadIdx.x] = acc;
    __syncthreads();
    if (row == 0 && j < head_dim) {
      float sum = 0;
      for (int r = 0; r < rows; ++r) sum += row_acc[r * cols + col];
      out[(int64_t(t) * n_heads + h) * head_dim + j] = sum / l;
    }
    __syncthreads();
  }
}

// Lever wide_attention_blocks: the GQA kernel in blocks of 8 warps over dense
// rows of up to 128 elements (8 warps hold an 8-head block's warp partials in
// 32 KB of shared memory).
template <typename KV, int HD>
constexpr bool kHasWideForm = HD <= 128 && !Storage<KV>::quantized;

// Lever tensor_core_attention: the tensor-core kernel of attention_mma.cu, over
// bf16 or f16 rows of 64 or 128, past kTensorCoreAttentionFromKeys keys (or the
// cache's splits of kMinKeysPerSplit keys, where they hold fewer), where its grid
// fits one wave of its two blocks an SM, in place of either CUDA-core form.
// There the CUDA-core kernel's per-key chains grow with the keys a split takes,
// the tensor cores' barely, and since their fixed steps were made cheaper they
// win at 64 keys a split too: one sequence at 1-4k keys, H200 int4, Llama-3-8B
// +1-3%, Qwen3-30B-A3B +5-10% (docs/benchmarks.md, fortieth session). Over
// several waves (batches) the CUDA-core kernel's three blocks an SM win (4
// sequences at 2-4k keys: 7-10%, thirty-eighth session). Unknown key counts (a
// prefill) keep the CUDA cores.
template <typename KV, int HD>
constexpr bool kHasTensorCoreForm =
    (std::is_same_v<KV, __nv_bfloat16> || std::is_same_v<KV, __half>) && (HD == 64 || HD == 128);

bool tensor_core_form(int rows_kv_chunks, int n_splits) {
  const int64_t keys = decode_keys();
  const int64_t from = std::min<int64_t>(int64_t(n_splits) * kMinKeysPerSplit, kTensorCoreAttentionFromKeys);
  if (!tensor_core_attention_enabled() || keys <= 0 ||
      int64_t(rows_kv_chunks) * n_splits > kTensorCoreAttentionBlocksPerSm * sm_count())
    return false;
  if (keys > from) {
    narrow_decode_keys_range(from + 1, INT64_MAX);
    return true;
  }
  narrow_decode_keys_range(1, from);
  return false;
}

// The splits of an 8-warp grid of `per_split` blocks a split, 0 where the
// 4-warp form runs: 8 warps where the splits with keys to walk fit one wave of
// one block an SM. A short context's few blocks then walk their keys with twice
// the warps; with more blocks, 2-3 blocks of 4 warps an SM keep more loads in
// flight. The splits with keys, ceil(keys / kMinKeysPerSplit) up to n_splits,
// depend on the step's key count (decode_keys): the decode graph captured for
// it serves the counts that choose the same, and its grid holds the fewest
// splits, a power of two, that hold the step's keys (the kernel marks the
// partials past them empty), not the cache's or a wave's: one or two splits
// merge in a cluster (lever cluster_attention_merge) where more would leave
// their partials to o_proj's prepare kernel, whatever the cache's rows.
int wide_grid_splits(int per_split, int n_splits) {
  if (!wide_attention_blocks_enabled()) return 0;
  const int64_t splits_in_a_wave = sm_count() / per_split;
  const int64_t keys = decode_keys();
  if (keys <= 0) return n_splits <= splits_in_a_wave ? n_splits : 0;  // unknown: all of the cache may be in use
  const int64_t cap = std::min<int64_t>(n_splits, splits_in_a_wave);
  int64_t grid = 1;  // a power of two: its splits of kMinKeysPerSplit keys hold the step's
  while (grid < cap && grid * kMinKeysPerSplit < keys) grid *= 2;
  // The key counts that choose the same: more than half of the grid holds.
  const int64_t lo = grid / 2 * kMinKeysPerSplit + 1;
  if (grid < cap) {
    narrow_decode_keys_range(lo, grid * kMinKeysPerSplit);
    return int(grid);
  }
  if (n_splits <= splits_in_a_wave) {  // at any context past lo
    narrow_decode_keys_range(lo, INT64_MAX);
    return n_splits;
  }
  const int64_t most = splits_in_a_wave * kMinKeysPerSplit;
  if (keys <= most) {
    narrow_decode_keys_range(lo, most);
    return int(splits_in_a_wave);
  }
  narrow_decode_keys_range(most + 1, INT64_MAX);
  return 0;
}

// The form of the wide grid (lever wide_attention_blocks).
struct WideForm {
  int heads = 0;   // a block's, 0: the 4-warp form runs
  int splits = 0;  // the grid's
};

// The wide form of a group of heads over `rows_kv` (rows x kv heads) blocks:
// the fewest heads a block (1, 2, 4, 8) whose blocks fit a wave. Each block's
// work is a chain of dependent steps per head (rows roped, scores, softmax,
// partials), so at short contexts spreading a kv head's heads over more blocks
// shortens the chain; the kv head's K/V, read by each of them, is then small
// and in L2. Groups of 1-2 too since the forty-ninth session (Qwen3-0.6B: one
// sequence +5% bf16, +12% int4, and its splits merge in clusters).
WideForm wide_form(int group, int rows_kv, int n_splits) {
  const int block = group <= 2 ? group : group <= 4 ? 4 : 8;  // the 4-warp form's heads a block
  for (int hb = 1; hb <= block; hb *= 2)
    if (const int splits = wide_grid_splits(rows_kv * ((group + hb - 1) / hb), n_splits)) return {hb, splits};
  return {};
}

// launch_kernel, with the grid in clusters of `cluster` blocks unless it is 0
// (lever cluster_attention_merge: a (kv head, chunk, row)'s splits).
template <typename... Params, typename... Args>
cudaError_t launch_kernel_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 cluster, dim3 block,
                                      cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  int n = 0;
  if (cluster.x > 0) {
    attribute[n].id = cudaLaunchAttributeClusterDimension;
    attribute[n].val.clusterDim.x = cluster.x;
    attribute[n].val.clusterDim.y = cluster.y;
    attribute[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  if (programmatic_launch_enabled()) {
    attribute[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  config.attrs = attribute;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// The most splits lever cluster_attention_merge merges in a cluster. Clusters
// of 3-8 splits lost 1-16% of a decode step against merging the partials in
// o_proj's prepare kernel: a cluster starts only once that many SMs of one GPC
// have room, which the matvec before it holds (Llama-3-8B int4, 7 splits:
// attention 8.7 -> 16.6 us a layer; H200, docs/benchmarks.md, twenty-ninth
// session); 1-2 splits gained up to 4.5%. Where the partials would take a merge
// kernel of their own, one row's clusters of 3-4 splits pay for that kernel
// (qwen3-4b, whose o_proj runs on the CUDA cores: +2-4%); 5 and more lost there too.
constexpr int kMaxClusterSplits = 2;
constexpr int kMaxClusterSplitsSavingAKernel = 4;

// merged (lever cluster_attention_merge, attention_merges_in_clusters said yes):
// the splits merge in clusters and write the output there, no partials.
template <typename KV, int HD, bool kFresh = false>
cudaError_t launch_gqa_heads(const float* q, const typename Storage<KV>::Unit* k,
                             const typename Storage<KV>::Unit* v, const AffineGroups& groups, float* part_m,
                             float* part_l, float* part_o, int T, int n_heads, int n_kv_heads, int head_dim,
                             const int32_t* pos_dev, int64_t pos0, int n_splits, float scale, const KvTables& tables,
                             cudaStream_t stream, const FreshArgs<kFresh>& fresh = {}, float* merged = nullptr) {
  const int group = n_heads / n_kv_heads;
  const bool rows_final = pos_dev && cached_rows_final();
  auto go = [&]<int HB, int NW>(int grid_splits) {
    const int chunks = (group + HB - 1) / HB;
    return launch_kernel_in_clusters(attention_gqa_kernel<KV, HD, HB, kFresh, NW>,
                                     dim3(n_kv_heads * chunks, T, grid_splits),
                                     merged ? dim3(1, 1, grid_splits) : dim3(0, 0, 0), NW * 32, stream, q, k, v,
                                     groups, part_m, part_l, part_o, merged, n_heads, n_kv_heads, head_dim, pos_dev,
                                     pos0, scale, n_splits, tables, fresh, rows_final);
  };
  // Lever tensor_core_attention, whichever CUDA-core form would run, on the
  // wide form's grid where that would run: it narrows the step's key range,
  // within which its splits hold every key, and o_proj's prepare reads only
  // those (attention_written_splits).
  WideForm wide;  // heads 0: the 4-warp form's grid
  if constexpr (kHasWideForm<KV, HD>) wide = wide_form(group, T * n_kv_heads, n_splits);
  if constexpr (kHasTensorCoreForm<KV, HD>) {
    const int tc_chunks = (group + kTensorCoreAttentionHeads - 1) / kTensorCoreAttentionHeads;
    if (!merged && head_dim == HD) {
      const int grid_splits = wide.heads > 0 ? wide.splits : n_splits;
      if (tensor_core_form(T * n_kv_heads * tc_chunks, n_splits))
        return launch_attention_mma<KV, HD, kFresh>(q, k, v, part_m, part_l, part_o, T, n_heads, n_kv_heads,
                                                    pos_dev, pos0, n_splits, grid_splits, scale, tables, stream,
                                                    fresh, rows_final);
    }
  }
  if constexpr (kHasWideForm<KV, HD>) {
    if (merged && wide.splits > kMaxClusterSplitsSavingAKernel) return cudaErrorInvalidValue;
    switch (wide.heads) {
      case 1: return go.template operator()<1, 8>(wide.splits);
      case 2: return go.template operator()<2, 8>(wide.splits);
      case 4: return go.template operator()<4, 8>(wide.splits);
      case 8: return go.template operator()<8, 8>(wide.splits);
    }
  }
  if (merged) return cudaErrorInvalidValue;  // only the wide form's few splits merge in clusters
  // Heads per block: the group rounded up to a power of two, at most 8 (larger
  // groups take several blocks per kv head).
  if (group <= 1) return go.template operator()<1, 4>(n_splits);
  if (group <= 2) return go.template operator()<2, 4>(n_splits);
  if (group <= 4) return go.template operator()<4, 4>(n_splits);
  return go.template operator()<8, 4>(n_splits);
}

}  // namespace

// Two blocks an SM: at 8k keys of Llama-3-8B (8 kv heads) 32 splits of 256 keys
// decoded 8-11% faster than 64 of 128 (H200, 2026-11-30).
int attention_splits(int64_t n_keys, int64_t kv_heads) {
  const int64_t two_per_sm = std::max<int64_t>(1, 2 * sm_count() / std::max<int64_t>(1, kv_heads));
  const int64_t by_keys = ceil_div(std::max<int64_t>(n_keys, 1), kMinKeysPerSplit);
  return int(std::min<int64_t>({by_keys, two_per_sm, int64_t(kMaxAttentionSplits)}));
}

cudaError_t launch_attention(const float* q, const void* k, const void* v, DType kv_dtype, float* part_m,
                             float* part_l, float* part_o, float* out, int T, int n_heads, int n_kv_heads,
                             int head_dim, const int32_t* pos_dev, int64_t pos0, int n_splits, float scale,
                             const KvTables& tables, cudaStream_t stream, float* merged) {
  cudaError_t status = cudaSuccess;
  cudaError_t err = visit_float(kv_dtype, [&]<typename KV>() {
    const KV* kp = static_cast<const KV*>(k);
    const KV* vp = static_cast<const KV*>(v);
    const bool wide = (head_dim * sizeof(KV)) % 16 == 0 && reinterpret_cast<uintptr_t>(k) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(v) % 16 == 0;
    auto go = [&]<int HD>() {
      status = launch_gqa_heads<KV, HD>(q, kp, vp, AffineGroups{}, part_m, part_l, part_o, T, n_heads, n_kv_heads,
                                        head_dim, pos_dev, pos0, n_splits, scale, tables, stream, {}, merged);
    };
    if (!wide && merged)
      status = cudaErrorInvalidValue;
    else if (!wide)
      launch_kernel(attention_split_kernel<KV>, dim3(n_heads, T, n_splits), kWarps * 32, 0, stream,
          q, kp, vp, part_m, part_l, part_o, n_heads, n_kv_heads, head_dim, pos_dev, pos0, scale, n_splits, tables);
    else if (head_dim <= 32) go.template operator()<32>();
    else if (head_dim <= 64) go.template operator()<64>();
    else if (head_dim <= 128) go.template operator()<128>();
    else go.template operator()<256>();
  });
  if (status != cudaSuccess) return status;
  if (err != cudaSuccess || merged) return err;
  return out ? launch_attention_merge(part_m, part_l, part_o, out, T, n_heads, head_dim, n_splits, stream) : err;
}

namespace {

// Whether the GQA kernel over this dense cache may take the wide form (its
// 16-byte loads, the instances compiled).
bool wide_form_fits(int n_heads, int n_kv_heads, int head_dim, DType kv_dtype, const void* k, const void* v) {
  const bool dense = kv_dtype == DType::f32 || kv_dtype == DType::bf16 || kv_dtype == DType::f16;
  return dense && head_dim > 0 && head_dim <= 128 && (head_dim * dtype_size(kv_dtype)) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(k) % 16 == 0 && reinterpret_cast<uintptr_t>(v) % 16 == 0 && n_kv_heads > 0 &&
         n_heads % n_kv_heads == 0;
}

}  // namespace

bool attention_merges_in_clusters(int T, int n_heads, int n_kv_heads, int head_dim, DType kv_dtype, const void* k,
                                  const void* v, int n_splits, bool saves_merge_kernel) {
  if (!cluster_attention_merge_enabled() || !wide_form_fits(n_heads, n_kv_heads, head_dim, kv_dtype, k, v))
    return false;
  const WideForm wide = wide_form(n_heads / n_kv_heads, T * n_kv_heads, n_splits);
  const int most = T == 1 && saves_merge_kernel ? kMaxClusterSplitsSavingAKernel : kMaxClusterSplits;
  return wide.heads > 0 && wide.splits <= most;
}

int attention_written_splits(int T, int n_heads, int n_kv_heads, int head_dim, DType kv_dtype, const void* k,
                             const void* v, int n_splits) {
  if (!wide_form_fits(n_heads, n_kv_heads, head_dim, kv_dtype, k, v)) return n_splits;
  const WideForm wide = wide_form(n_heads / n_kv_heads, T * n_kv_heads, n_splits);
  return wide.heads > 0 ? wide.splits : n_splits;
}

cudaError_t launch_attention_merge(const float* part_m, const float* part_l, const float* part_o, float* out, int T,
                                   int n_heads, int head_dim, int n_splits, cudaStream_t stream) {
  return launch_kernel(attention_merge_kernel, dim3(n_heads, T), kMergeThreads, 0, stream, part_m, part_l, part_o,
                       out, n_heads, head_dim, n_splits);
}

// Dense caches whose rows take the GQA kernel's 16-byte loads, head_dim up to
// 128 (the instances compiled), the group in one block (so one block writes the
// new rows).
bool rope_in_attention_supports(int head_dim, int n_heads, int n_kv_heads, DType kv_dtype, const void* k_cache,
                                const void* v_cache) {
  return wide_form_fits(n_heads, n_kv_heads, head_dim, kv_dtype, k_cache, v_cache) && n_heads / n_kv_heads <= 8;
}

bool rope_in_attention_takes_rows(int rows, int n_heads, int n_kv_heads, int n_splits) {
  const int group = n_heads / n_kv_heads;
  if (rows == 1 || (rows <= 4 && group <= 4)) return true;
  return rows <= 8 && group <= 8 && wide_form(group, rows * n_kv_heads, n_splits).heads > 0;
}

cudaError_t launch_rope_in_attention(const FreshRows& fresh, const RopeParams& rope, DType kv_dtype, float* part_m,
                                     float* part_l, float* part_o, int T, int n_heads, int n_kv_heads, int head_dim,
                                     const int32_t* pos_dev, int n_splits, float scale, const KvTables& tables,
                                     cudaStream_t stream, float* merged) {
  if (!rope_in_attention_supports(head_dim, n_heads, n_kv_heads, kv_dtype, fresh.k_cache, fresh.v_cache) ||
      !pos_dev || (T > 1 && !tables.rows_are_sequences))
    return cudaErrorInvalidValue;  // one new token per row, at *pos_dev
  const FreshInputs inputs{fresh, rope};
  cudaError_t status = cudaSuccess;
  const cudaError_t err = visit_float(kv_dtype, [&]<typename KV>() {
    const KV* k = static_cast<const KV*>(fresh.k_cache);
    const KV* v = static_cast<const KV*>(fresh.v_cache);
    auto go = [&]<int HD>() {
      status = launch_gqa_heads<KV, HD, true>(fresh.q, k, v, AffineGroups{}, part_m, part_l, part_o, T, n_heads,
                                              n_kv_heads, head_dim, pos_dev, 0, n_splits, scale, tables, stream,
                                              inputs, merged);
    };
    if (head_dim <= 32) go.template operator()<32>();
    else if (head_dim <= 64) go.template operator()<64>();
    else go.template operator()<128>();
  });
  return status != cudaSuccess ? status : err;
}

bool attention_affine_supports(int head_dim) {
  return head_dim % 8 == 0 && head_dim <= kMaxAttentionHeadDim;
}

cudaError_t launch_attention_affine(const float* q, const AffineKv& kv, float* part_m, float* part_l, float* part_o,
                                    float* out, int T, int n_heads, int n_kv_heads, int head_dim,
                                    const int32_t* pos_dev, int64_t pos0, int n_splits, float scale,
                                    const KvTables& tables, cudaStream_t stream) {
  // Pieces of 8 codes: 8-byte loads for 8 bits, 4-byte loads for 4 bits.
  const uintptr_t align = kv.bits == 8 ? 8 : 4;
  const int group = head_dim < kKvQuantGroup ? head_dim : kKvQuantGroup;
  if (!attention_affine_supports(head_dim) || group % 8 != 0 || head_dim % group != 0 ||
      (kv.bits != 8 && kv.bits != 4) || reinterpret_cast<uintptr_t>(kv.k_codes) % align ||
      reinterpret_cast<uintptr_t>(kv.v_codes) % align)
    return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  if (tensor_core_kv_attention_enabled() && attention_affine_mma_supports(head_dim, kv.bits)) {
    err = launch_attention_affine_mma(q, kv, part_m, part_l, part_o, T, n_heads, n_kv_heads, head_dim, pos_dev, pos0,
                                      n_splits, scale, tables, stream);
    if (err == cudaSuccess)
      return out ? launch_attention_merge(part_m, part_l, part_o, out, T, n_heads, head_dim, n_splits, stream) : err;
    if (err != cudaErrorInvalidValue) return err;  // else rows off its alignment: the CUDA-core kernel below
  }
  const AffineGroups groups{static_cast<const uint16_t*>(kv.k_scales), static_cast<const uint16_t*>(kv.k_biases),
                            static_cast<const uint16_t*>(kv.v_scales), static_cast<const uint16_t*>(kv.v_biases),
                            group};
  auto go_bits = [&]<int kBits>() {
    auto go = [&]<int HD>() {
      launch_gqa_heads<Affine<kBits>, HD>(q, static_cast<const uint8_t*>(kv.k_codes),
                                          static_cast<const uint8_t*>(kv.v_codes), groups, part_m, part_l, part_o, T,
                                          n_heads, n_kv_heads, head_dim, pos_dev, pos0, n_splits, scale, tables,
                                          stream);
    };
    if (head_dim <= 32) go.template operator()<32>();
    else if (head_dim <= 64) go.template operator()<64>();
    else if (head_dim <= 128) go.template operator()<128>();
    else go.template operator()<256>();
  };
  if (kv.bits == 8) go_bits.template operator()<8>();
  else go_bits.template operator()<4>();
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return out ? launch_attention_merge(part_m, part_l, part_o, out, T, n_heads, head_dim, n_splits, stream) : err;
}

}  // namespace mere::cuda
