// Split-K decode attention over a groupwise affine K/V cache (KV modes affine8
// and affine4) on the tensor cores: lever tensor_core_kv_attention.
//
// Why: the CUDA-core kernel (attention.cu) spends three instructions turning
// each code into a float (byte, -2^23, scale and bias) before its FMAs and its
// shuffle reductions; at 15% occupancy it is bound by instruction issue and read
// its codes at 0.97 TB/s against 2.4 TB/s for bf16 rows. Here the codes go into
// f16 mma operands as they are and the scales and biases are applied per key,
// outside the sums:
//
//   q.k = s * sum_d q_d c_d + b * sum_d q_d            (per group of 64 dims)
//   sum_k p_k v_kd = sum_k (p_k s_k) c_kd + sum_k p_k b_k
//
// A code c enters an f16 as kOffset + c (its bits under a fixed exponent, one or
// two instructions for two codes; Codes below); the offset is taken back out of
// the sums with the sums of q and of p s. q and p s are rounded to f16 (11 bits;
// the affine8 codes themselves carry 8), sums are f32.
//
// Layout: a block takes one kv head, up to 8 of its query heads (rows 0-7 of the
// m16 tiles; rows 8-15 are zero) and one split; its 4 warps take 8-key tiles in
// turn, the next tile's loads in flight while one is computed. In a warp, lane
// (g, t) = (lane / 4, lane % 4):
//   q.k  m16n8k16 per 16 dims of a group: A = q (heads x dims), B = K codes of
//        key g (16 contiguous codes of each group from lane t), C = scores of
//        head g for keys 2t, 2t+1. The order of dims within an mma follows the
//        codes' bytes (k_dims); q is loaded in the same order.
//   p.v  m16n8k8 per 16 dims: A = V codes transposed (dims x keys 2t, 2t+1;
//        8 contiguous codes of each group from row g), B = p s of head g for keys
//        2t, 2t+1 (the scores' own registers), C = out of heads 2t, 2t+1.
// Partials (max, sum, out) per split go to attention.cu's merge kernel.
#include <cstdint>
#include <type_traits>

#include "ops/cuda/attention_split.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/f16x2.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kTileKeys = 8;                 // keys per warp per step
constexpr int kHeadsPerBlock = 8;            // query heads a block takes (rows 0-7)
constexpr int kGroup = 64;                   // dims per scale/bias group (= kKvQuantGroup)
// p s is stored x64: small weights stay out of f16's subnormals, and V groups
// with a range up to 2.6e5 (scale 1023) still fit under f16's largest value
// (wider ones saturate: a bounded error, never an infinity).
constexpr float kWeightScale = 64.0f;

__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_m16n8k8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

// How a lane's codes are loaded: K pieces are the 16 codes [16t, 16t + 16) of a
// group, V pieces the 8 codes [8g, 8g + 8). A code c becomes the f16 kOffset + c:
// 8 bits go under the exponent of 1024 (a byte permute), 4 bits under that of
// 16, shifted to the mantissa's top (an offset of 1024 would leave the sums of
// 4-bit codes 7 bits under it, and the f32 sums lose them).
template <int kBits>
struct Codes {
  using KPiece = std::conditional_t<kBits == 8, uint4, uint2>;
  using VPiece = std::conditional_t<kBits == 8, uint2, uint32_t>;
  static constexpr int kGroupBytes = kGroup * kBits / 8;
  static constexpr float kOffset = kBits == 8 ? 1024.0f : 16.0f;
};
constexpr uint32_t kF16x2Of16 = 0x4C004C00u;  // f16x2 (16, 16); with a nibble at bits 6-9: 16 + c
// Nibbles at bits 0-3 and 16-19 of `w` as the f16x2 (16 + lo, 16 + hi).
__device__ __forceinline__ uint32_t nibbles_f16x2(uint32_t w) { return ((w & 0x000F000Fu) << 6) | kF16x2Of16; }

// The dims (within a group) of k-step j's four k slots held by lane t, in the
// order [a0.lo, a0.hi, a2.lo, a2.hi]: they follow k_operands' code order.
template <int kBits>
__device__ __forceinline__ void k_dims(int t, int j, int (&d)[4]) {
  if constexpr (kBits == 8) {
    const int base = 16 * t + 4 * j;  // word j's bytes 0, 1 | 2, 3
    d[0] = base, d[1] = base + 1, d[2] = base + 2, d[3] = base + 3;
  } else {
    const int base = 16 * t + 8 * (j >> 1) + 2 * (j & 1);  // nibbles i, i+4 | i+1, i+5 of word j/2
    d[0] = base, d[1] = base + 4, d[2] = base + 1, d[3] = base + 5;
  }
}

// The B operand (two f16x2 of kOffset + code) of k-step j from a lane's K piece.
template <int kBits>
__device__ __forceinline__ void k_operands(const typename Codes<kBits>::KPiece& piece, int j, uint32_t& b0,
                                           uint32_t& b1) {
  if constexpr (kBits == 8) {
    const uint32_t words[4] = {piece.x, piece.y, piece.z, piece.w};
    b0 = __byte_perm(words[j], 0x6464u, 0x4140);
    b1 = __byte_perm(words[j], 0x6464u, 0x4342);
  } else {
    const uint32_t w = (j >> 1) ? piece.y : piece.x;
    const int i = 2 * (j & 1);
    b0 = nibbles_f16x2(w >> (4 * i));
    b1 = nibbles_f16x2(w >> (4 * i + 4));
  }
}

// The A operand of p.v tile m (dims 8g + 2m, 8g + 2m + 1 of a group) from the V
// pieces of keys 2t (va) and 2t + 1 (vb): a0 row g, a1 row g + 8.
template <int kBits>
__device__ __forceinline__ void v_operands(const typename Codes<kBits>::VPiece& va,
                                           const typename Codes<kBits>::VPiece& vb, int m, uint32_t& a0,
                                           uint32_t& a1) {
  if constexpr (kBits == 8) {
    const uint32_t x = (m >> 1) ? va.y : va.x, y = (m >> 1) ? vb.y : vb.x;
    const uint32_t pair = __byte_perm(x, y, (m & 1) ? 0x7362 : 0x5140);  // codes 2m, 2m+1 of both keys
    a0 = __byte_perm(pair, 0x6464u, 0x4140);
    a1 = __byte_perm(pair, 0x6464u, 0x4342);
  } else {
    const uint32_t both = __byte_perm(va, vb, uint32_t(m | (m << 4) | ((4 + m) << 8) | ((4 + m) << 12)));
    a0 = nibbles_f16x2(both);
    a1 = nibbles_f16x2(both >> 4);
  }
}

// The NG (1 or 2) bf16 scales or biases of one cache row and kv head, in one load.
template <int NG>
__device__ __forceinline__ uint32_t load_group_params(const uint16_t* p) {
  if constexpr (NG == 1) return __ldg(p);
  else return __ldg(reinterpret_cast<const uint32_t*>(p));
}
// Group G's value (bf16 as f32) of a load_group_params word.
__device__ __forceinline__ float group_param(uint32_t word, int G) {
  return __uint_as_float(G == 0 ? word << 16 : word & 0xffff0000u);
}

template <int kBits, int HD>
struct TileLoads {
  static constexpr int NG = HD / kGroup;
  typename Codes<kBits>::KPiece k[NG];     // key g
  typename Codes<kBits>::VPiece v[2][NG];  // keys 2t, 2t + 1
  uint32_t ks[2], kb[2], vs[2], vb[2];     // their scales and biases (load_group_params)
};

// kMinBlocks blocks per SM: 4 fits a long context's splits in one wave (ptxas
// spills a few words to fit 128 registers), 3 keeps every register (a few
// percent faster when the grid fits in three a SM anyway).
template <int kBits, int HD, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    attention_affine_mma_kernel(const float* __restrict__ q, const uint8_t* __restrict__ k_codes,
                                const uint8_t* __restrict__ v_codes, const AffineKv kv, float* __restrict__ part_m,
                                float* __restrict__ part_l, float* __restrict__ part_o, int n_heads, int n_kv_heads,
                                const int32_t* __restrict__ pos_dev, int64_t pos0, float scale, int n_splits,
                                const __grid_constant__ KvTables tables) {
  allow_next_kernel();
  wait_for_previous_kernel();
  using C = Codes<kBits>;
  using Loads = TileLoads<kBits, HD>;
  constexpr int NG = HD / kGroup;
  constexpr int kRowBytes = HD * kBits / 8;  // one kv head's codes in a cache row

  const int group = n_heads / n_kv_heads, chunks = (group + kHeadsPerBlock - 1) / kHeadsPerBlock;
  const int kv_h = blockIdx.x / chunks, head0 = (blockIdx.x % chunks) * kHeadsPerBlock;
  const int row_t = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int32_t* table = tables.table[tables.rows_are_sequences ? row_t : 0];
  const int n_keys = int((pos_dev ? *pos_dev : pos0) + (tables.rows_are_sequences ? 0 : row_t) + 1);
  const KeyRange range = split_range(n_keys, n_splits, split);
  auto head_ok = [&](int r) { return head0 + r < group; };
  auto slot = [&](int r) { return (int64_t(row_t) * n_heads + kv_h * group + head0 + r) * n_splits + split; };
  if (range.begin >= range.end) {
    if (threadIdx.x < kHeadsPerBlock && head_ok(threadIdx.x)) {
      part_m[slot(threadIdx.x)] = -INFINITY;
      part_l[slot(threadIdx.x)] = 0;
    }
    return;
  }

  // q of head g (scaled, f16) as A operands, and its f16 values summed per group.
  uint32_t qa[NG][4][2];
  float q_sum[NG];
  {
    const float* qr = q + (int64_t(row_t) * n_heads + kv_h * group + head0 + g) * HD;
#pragma unroll
    for (int G = 0; G < NG; ++G) {
      q_sum[G] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int d[4];
        k_dims<kBits>(t, j, d);
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = head_ok(g) ? qr[G * kGroup + d[i]] * scale : 0.0f;
        qa[G][j][0] = pack_f16x2(v[0], v[1]);
        qa[G][j][1] = pack_f16x2(v[2], v[3]);
        const float2 r0 = unpack_f16x2(qa[G][j][0]), r1 = unpack_f16x2(qa[G][j][1]);
        q_sum[G] += (r0.x + r0.y) + (r1.x + r1.y);
      }
      q_sum[G] += __shfl_xor_sync(0xffffffffu, q_sum[G], 1);
      q_sum[G] += __shfl_xor_sync(0xffffffffu, q_sum[G], 2);
    }
  }

  const uint16_t* ks_base = static_cast<const uint16_t*>(kv.k_scales);
  const uint16_t* kb_base = static_cast<const uint16_t*>(kv.k_biases);
  const uint16_t* vs_base = static_cast<const uint16_t*>(kv.v_scales);
  const uint16_t* vb_base = static_cast<const uint16_t*>(kv.v_biases);
  // The loads of the tile at key `base`; keys past the split read nothing and
  // come back as zero codes, scales and biases.
  auto load = [&](int base, Loads& L) {
    const int key_k = base + g;
    if (key_k < range.end) {
      const uint8_t* p = k_codes + (paged_row(table, key_k) * n_kv_heads + kv_h) * kRowBytes + t * (C::kGroupBytes / 4);
#pragma unroll
      for (int G = 0; G < NG; ++G)
        L.k[G] = __ldg(reinterpret_cast<const typename C::KPiece*>(p + G * C::kGroupBytes));
    } else {
#pragma unroll
      for (int G = 0; G < NG; ++G) L.k[G] = {};
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int key = base + 2 * t + i;
      if (key < range.end) {
        const int64_t rh = paged_row(table, key) * n_kv_heads + kv_h;  // row and kv head
        const uint8_t* p = v_codes + rh * kRowBytes + g * (C::kGroupBytes / 8);
#pragma unroll
        for (int G = 0; G < NG; ++G)
          L.v[i][G] = __ldg(reinterpret_cast<const typename C::VPiece*>(p + G * C::kGroupBytes));
        L.ks[i] = load_group_params<NG>(ks_base + rh * NG);
        L.kb[i] = load_group_params<NG>(kb_base + rh * NG);
        L.vs[i] = load_group_params<NG>(vs_base + rh * NG);
        L.vb[i] = load_group_params<NG>(vb_base + rh * NG);
      } else {
#pragma unroll
        for (int G = 0; G < NG; ++G) L.v[i][G] = {};
        L.ks[i] = L.kb[i] = L.vs[i] = L.vb[i] = 0;
      }
    }
  };

  // Online softmax of head g (the same in the 4 lanes of a quad), out of heads
  // 2t, 2t+1 for dims (G, m, row): rows g and g + 8 of p.v tile m.
  float m_run = -INFINITY, l_run = 0;          // l: this lane's keys only, summed at the end
  float p_sum[NG] = {}, pb_sum[NG] = {};       // sums of f16(64 p s) and of p b, this lane's keys
  float o[NG][4][4] = {};

  Loads next, cur;
  int base = range.begin + warp * kTileKeys;
  load(base, next);
  for (; base < range.end; base += kWarps * kTileKeys) {
    cur = next;
    load(base + kWarps * kTileKeys, next);

    float acc[NG][4];
#pragma unroll
    for (int G = 0; G < NG; ++G) {
      acc[G][0] = acc[G][1] = acc[G][2] = acc[G][3] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t b0, b1;
        k_operands<kBits>(cur.k[G], j, b0, b1);
        mma_m16n8k16(acc[G], qa[G][j][0], qa[G][j][1], b0, b1);
      }
    }
    // Scores of head g for keys 2t, 2t+1: acc holds sum q (kOffset + c).
    float score[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float s = 0;
#pragma unroll
      for (int G = 0; G < NG; ++G) {
        const float k_scale = group_param(cur.ks[i], G), k_bias = group_param(cur.kb[i], G);
        s += k_scale * acc[G][i] + (k_bias - C::kOffset * k_scale) * q_sum[G];
      }
      score[i] = base + 2 * t + i < range.end ? s : -INFINITY;
    }
    float tile_max = fmaxf(score[0], score[1]);
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float m_new = fmaxf(m_run, tile_max);
    const float ref = m_new == -INFINITY ? 0.0f : m_new;
    const float correction = __expf(m_run - ref);
    const float p0 = __expf(score[0] - ref), p1 = __expf(score[1] - ref);
    m_run = m_new;
    l_run = l_run * correction + p0 + p1;
    // Rescale only when some head's maximum moved (rare once the first tiles are in).
    if (!__all_sync(0xffffffffu, correction == 1.0f)) {
      const float ca = __shfl_sync(0xffffffffu, correction, 8 * t);      // head 2t
      const float cb = __shfl_sync(0xffffffffu, correction, 8 * t + 4);  // head 2t + 1
#pragma unroll
      for (int G = 0; G < NG; ++G) {
        p_sum[G] *= correction, pb_sum[G] *= correction;
#pragma unroll
        for (int m = 0; m < 4; ++m) o[G][m][0] *= ca, o[G][m][1] *= cb, o[G][m][2] *= ca, o[G][m][3] *= cb;
      }
    }
#pragma unroll
    for (int G = 0; G < NG; ++G) {
      const uint32_t w = pack_f16x2(p0 * group_param(cur.vs[0], G) * kWeightScale,
                                    p1 * group_param(cur.vs[1], G) * kWeightScale);
      const float2 wr = unpack_f16x2(w);
      p_sum[G] += wr.x + wr.y;
      pb_sum[G] += p0 * group_param(cur.vb[0], G) + p1 * group_param(cur.vb[1], G);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        uint32_t a0, a1;
        v_operands<kBits>(cur.v[0][G], cur.v[1][G], m, a0, a1);
        mma_m16n8k8(o[G][m], a0, a1, w);
      }
    }
  }

  // Sums over the quad (the lanes of head g), then out = (acc - kOffset sum w) / 64 + sum p b.
#pragma unroll
  for (int off = 1; off <= 2; off *= 2) {
    l_run += __shfl_xor_sync(0xffffffffu, l_run, off);
#pragma unroll
    for (int G = 0; G < NG; ++G) {
      p_sum[G] += __shfl_xor_sync(0xffffffffu, p_sum[G], off);
      pb_sum[G] += __shfl_xor_sync(0xffffffffu, pb_sum[G], off);
    }
  }
  __shared__ float warp_m[kWarps][kHeadsPerBlock], warp_l[kWarps][kHeadsPerBlock];
  __shared__ __align__(16) float warp_o[kWarps][kHeadsPerBlock][kPaddedWarpORow<HD>];
  if (t == 0) warp_m[warp][g] = m_run, warp_l[warp][g] = l_run;
#pragma unroll
  for (int G = 0; G < NG; ++G) {
    const float wa = __shfl_sync(0xffffffffu, p_sum[G], 8 * t), wb = __shfl_sync(0xffffffffu, p_sum[G], 8 * t + 4);
    const float ba = __shfl_sync(0xffffffffu, pb_sum[G], 8 * t), bb = __shfl_sync(0xffffffffu, pb_sum[G], 8 * t + 4);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int d = G * kGroup + 8 * g + 2 * m;
      *reinterpret_cast<float2*>(&warp_o[warp][2 * t][d]) =
          make_float2((o[G][m][0] - C::kOffset * wa) / kWeightScale + ba,
                      (o[G][m][2] - C::kOffset * wa) / kWeightScale + ba);
      *reinterpret_cast<float2*>(&warp_o[warp][2 * t + 1][d]) =
          make_float2((o[G][m][1] - C::kOffset * wb) / kWeightScale + bb,
                      (o[G][m][3] - C::kOffset * wb) / kWeightScale + bb);
    }
  }
  __syncthreads();
  write_block_partials<HD>(warp_m, warp_l, warp_o, HD, head_ok, slot, part_m, part_l, part_o);
}

}  // namespace

bool attention_affine_mma_supports(int head_dim, int bits) {
  return (head_dim == 64 || head_dim == 128) && (bits == 8 || bits == 4);
}

cudaError_t launch_attention_affine_mma(const float* q, const AffineKv& kv, float* part_m, float* part_l,
                                        float* part_o, int T, int n_heads, int n_kv_heads, int head_dim,
                                        const int32_t* pos_dev, int64_t pos0, int n_splits, float scale,
                                        const KvTables& tables, cudaStream_t stream) {
  // K pieces are 16 (8 bits) or 8 bytes, V pieces 8 or 4, scale pairs 4.
  const uintptr_t align = kv.bits == 8 ? 16 : 8;
  if (!attention_affine_mma_supports(head_dim, kv.bits) || reinterpret_cast<uintptr_t>(kv.k_codes) % align ||
      reinterpret_cast<uintptr_t>(kv.v_codes) % align || reinterpret_cast<uintptr_t>(kv.k_scales) % 4 ||
      reinterpret_cast<uintptr_t>(kv.k_biases) % 4 || reinterpret_cast<uintptr_t>(kv.v_scales) % 4 ||
      reinterpret_cast<uintptr_t>(kv.v_biases) % 4)
    return cudaErrorInvalidValue;
  const int chunks = (n_heads / n_kv_heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  const dim3 grid(n_kv_heads * chunks, T, n_splits);
  const auto* k = static_cast<const uint8_t*>(kv.k_codes);
  const auto* v = static_cast<const uint8_t*>(kv.v_codes);
  const bool wide = int64_t(grid.x) * grid.y * grid.z > 3 * int64_t(sm_count());
  auto go = [&]<int kBits, int HD>() {
    auto kernel = wide ? attention_affine_mma_kernel<kBits, HD, 4> : attention_affine_mma_kernel<kBits, HD, 3>;
    return launch_kernel(kernel, grid, kWarps * 32, 0, stream, q, k, v, kv, part_m, part_l, part_o, n_heads,
                         n_kv_heads, pos_dev, pos0, scale, n_splits, tables);
  };
  if (kv.bits == 8) return head_dim == 64 ? go.template operator()<8, 64>() : go.template operator()<8, 128>();
  return head_dim == 64 ? go.template operator()<4, 64>() : go.template operator()<4, 128>();
}

}  // namespace mere::cuda
