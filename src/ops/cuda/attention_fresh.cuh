// The new rows of a decode attention that ropes its own inputs (lever
// rope_in_attention): a block normalises and rotates its q heads into shared
// memory, and the block whose split holds the new key does the same for that
// key's k row and keeps k and v as the cache stores them (head chunk 0 also
// writing them to the cache), so the key loop takes the new key from there.
// Shared by the CUDA-core GQA kernel (attention.cu) and the tensor-core one
// (attention_mma.cu), so both see the same bits.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"
#include "ops/cuda/rope_row.cuh"

namespace mere::cuda {

// The new rows and their RoPE for a kernel that rotates its own inputs, nothing
// for one that reads q rotated and the new key cached.
struct FreshInputs {
  FreshRows rows;
  RopeParams rope;
};
struct NoFreshInputs {};
template <bool kFresh>
using FreshArgs = std::conditional_t<kFresh, FreshInputs, NoFreshInputs>;

__device__ __forceinline__ float norm_weight(const void* norm, DType dtype, int j) {
  if (dtype == DType::bf16) return to_float(static_cast<const __nv_bfloat16*>(norm)[j]);
  if (dtype == DType::f16) return to_float(static_cast<const __half*>(norm)[j]);
  return static_cast<const float*>(norm)[j];
}

// Where a block's rows sit: row t of q, kv head kv_h, the group's heads
// head0 .. head0 + HB - 1 (those at or past `group` are not there), the new key
// at position new_key of table (paged) or the cache.
struct FreshPlace {
  int t, n_heads, n_kv_heads, kv_h, group, head0, head_dim, new_key;
  const int32_t* table;
};

// A block of NW warps taking HB q heads of head_dim up to HD: rows warp + NW r
// are the q heads, then (in the block holding the new key) k and v.
template <typename KV, int HB, int HD, int NW>
struct FreshRowsInBlock {
  static constexpr int kPerLane = HD / 32, kRowsPerWarp = (HB + 2 + NW - 1) / NW;
  // q's rows hold 4 floats of padding after every 32, so that the tensor-core
  // kernel's lanes, each reading 4 dims at a time from its own run of HD / 4,
  // take q in 16-byte loads without bank conflicts.
  static constexpr int kQRow = HD + HD / 32 * 4;
  __device__ static constexpr int q_at(int j) { return j + j / 32 * 4; }
  struct Shared {
    __align__(16) float q[HB][kQRow];
    __align__(16) KV kv[2][HD];  // k, v
    float angle_sin[HD / 2], angle_cos[HD / 2];
    float staged[NW][HD];
  };
  float norm[kRowsPerWarp][kPerLane];  // the rows' q/k norm weights

  // What the rows' norm and rotation take besides the rows: the norm weights
  // (constant) and the angles (of the position only), so a decode step
  // prepares them before its wait.
  __device__ __forceinline__ void prepare(const FreshInputs& fresh, int new_key, int head_dim, Shared& sh) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int i = threadIdx.x; i < fresh.rope.half; i += blockDim.x)
      rope_angle(fresh.rope, i, new_key, sh.angle_sin[i], sh.angle_cos[i]);
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp + NW * rr;
      const void* w = r < HB ? fresh.rows.q_norm : r == HB ? fresh.rows.k_norm : nullptr;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        norm[rr][i] = w && lane + 32 * i < head_dim ? norm_weight(w, fresh.rows.norm_dtype, lane + 32 * i) : 0.0f;
    }
  }

  // The rows into sh.q and (holds_new_key) sh.kv; after prepare and the wait.
  // Ends with a __syncthreads.
  __device__ __forceinline__ void form(const FreshInputs& fresh, const FreshPlace& at, bool holds_new_key,
                                       Shared& sh) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const FreshRows& rows = fresh.rows;
    const RopeParams& rope = fresh.rope;
    auto head_ok = [&](int r) { return at.head0 + r < at.group; };
    // Every row's loads in flight before any is used.
    const int n_rows = HB + (holds_new_key ? 2 : 0);
    auto row_ok = [&](int r) { return r < n_rows && (r >= HB || head_ok(r)); };
    float e[kRowsPerWarp][kPerLane];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp + NW * rr;
      const float* src =
          r < HB ? rows.q + (int64_t(at.t) * at.n_heads + at.kv_h * at.group + at.head0 + r) * at.head_dim
                 : (r == HB + 1 ? rows.v : rows.k) + (int64_t(at.t) * at.n_kv_heads + at.kv_h) * at.head_dim;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        e[rr][i] = row_ok(r) && lane + 32 * i < at.head_dim ? src[lane + 32 * i] : 0.0f;
    }
    __syncthreads();  // the angles
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp + NW * rr;
      if (!row_ok(r)) continue;
      const bool is_q = r < HB, is_v = r == HB + 1;
      if (!is_v) {
        const void* w = is_q ? rows.q_norm : rows.k_norm;
        norm_and_rotate_row(
            e[rr], w != nullptr, norm[rr], rows.eps, rope,
            [&](int m, float& sn, float& cs) { sn = sh.angle_sin[m], cs = sh.angle_cos[m]; }, at.head_dim,
            sh.staged[warp], lane);
      }
      KV* cache_row = static_cast<KV*>(is_v ? rows.v_cache : rows.k_cache) +
                      (paged_row(at.table, at.new_key) * at.n_kv_heads + at.kv_h) * at.head_dim;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int j = lane + 32 * i;
        if (j >= at.head_dim) continue;
        if (is_q) {
          sh.q[r][q_at(j)] = e[rr][i];
        } else {
          const KV stored = from_float<KV>(e[rr][i]);
          sh.kv[is_v][j] = stored;
          if (at.head0 == 0) cache_row[j] = stored;
        }
      }
    }
    __syncthreads();
  }
};

}  // namespace mere::cuda
