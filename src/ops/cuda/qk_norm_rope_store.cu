// The attention inputs' epilogue in one launch: per-head q/k RMSNorm (Qwen3),
// RoPE on q and k, and the K/V cache write. One warp per (token, head row): rows
// [0, n_heads) are q, then n_kv_heads k rows, then n_kv_heads v rows. A warp
// keeps its row in registers (head_dim / 32 per lane) and stages it in shared
// memory so each lane can read its rotation partner. An affine cache (kBits 8
// or 4) gets the k and v rows quantized by the warp (kv_quant.cuh). A paged
// cache (KvTables) takes the row of the token's position through its sequence's
// block table; in a batch each row is a sequence at *start_pos.
#include "ops/cuda/common.cuh"
#include "ops/cuda/kv_quant.cuh"
#include "ops/cuda/launchers.h"
#include "ops/cuda/rope_row.cuh"

namespace mere::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxPerLane = kMaxAttentionHeadDim / 32;

// Scales and biases of an affine cache (unused for a dense one).
struct AffineScales {
  uint16_t *k_scales = nullptr, *k_biases = nullptr, *v_scales = nullptr, *v_biases = nullptr;
};

template <typename N, typename C, int kBits>  // kBits 0: a dense cache of C; 8 or 4: affine codes (C = uint8_t)
__global__ void __launch_bounds__(kWarps * 32)
    qk_norm_rope_store_kernel(float* q, const float* k, const float* v, const N* q_norm, const N* k_norm, float eps,
                              const __grid_constant__ RopeParams rope, const int32_t* start_pos, C* k_cache,
                              C* v_cache, const AffineScales affine, int n_heads, int n_kv_heads, int head_dim,
                              const __grid_constant__ KvTables tables) {
  allow_next_kernel();
  __shared__ float staged[kWarps][kMaxAttentionHeadDim];
  __shared__ float angle_sin[kMaxRopeHalf], angle_cos[kMaxRopeHalf];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + warp, t = blockIdx.y;
  const int n_rows = n_heads + 2 * n_kv_heads;
  const bool is_q = row < n_heads, is_v = row >= n_heads + n_kv_heads;
  // The row's norm weights, read before the wait (they never change).
  const N* norm = row >= n_rows || is_v ? nullptr : is_q ? q_norm : k_norm;
  float norm_w[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i)
    norm_w[i] = norm && lane + 32 * i < head_dim ? to_float(norm[lane + 32 * i]) : 0.0f;
  wait_for_previous_kernel();
  const bool per_sequence = tables.rows_are_sequences;
  const int64_t pos = int64_t(*start_pos) + (per_sequence ? 0 : t);
  // The block's rows share their token, so its rotation's sin and cos are
  // computed once a block: each lane of each q and k row computing its own
  // took 99 us at a 2,048-token chunk of Qwen3-30B-A3B, compute-bound.
  for (int m = threadIdx.x; m < rope.half; m += blockDim.x) rope_angle(rope, m, pos, angle_sin[m], angle_cos[m]);
  __syncthreads();
  if (row >= n_rows) return;
  const int64_t cache_pos = is_q ? 0 : paged_row(tables.table[per_sequence ? t : 0], pos);  // k, v: the storage row
  const int head = is_q ? row : is_v ? row - n_heads - n_kv_heads : row - n_heads;
  const float* src = is_q ? q + (int64_t(t) * n_heads + head) * head_dim
                          : (is_v ? v : k) + (int64_t(t) * n_kv_heads + head) * head_dim;

  float e[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    int j = lane + 32 * i;
    e[i] = j < head_dim ? src[j] : 0.0f;
  }
  // The quantized row of this k or v head: staged values -> codes, scale, bias.
  auto quantize_staged = [&] {
    __syncwarp();
    quantize_row_warp(staged[warp], head_dim, kBits, cache_pos * n_kv_heads + head,
                      reinterpret_cast<uint8_t*>(is_v ? v_cache : k_cache), is_v ? affine.v_scales : affine.k_scales,
                      is_v ? affine.v_biases : affine.k_biases, lane);
  };
  C* cache_row = nullptr;
  if constexpr (kBits == 0) cache_row = (is_v ? v_cache : k_cache) + (cache_pos * n_kv_heads + head) * head_dim;
  if (is_v) {
    if constexpr (kBits == 0) {
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i)
        if (lane + 32 * i < head_dim) cache_row[lane + 32 * i] = from_float<C>(e[i]);
    } else {
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) staged[warp][lane + 32 * i] = e[i];
      quantize_staged();
    }
    return;
  }
  norm_and_rotate_row(
      e, norm != nullptr, norm_w, eps, rope, [&](int m, float& s, float& c) { s = angle_sin[m], c = angle_cos[m]; },
      head_dim, staged[warp], lane);
  if (is_q) {
    float* q_row = q + (int64_t(t) * n_heads + head) * head_dim;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i)
      if (lane + 32 * i < head_dim) q_row[lane + 32 * i] = e[i];
  } else if constexpr (kBits == 0) {
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i)
      if (lane + 32 * i < head_dim) cache_row[lane + 32 * i] = from_float<C>(e[i]);
  } else {  // an affine cache's k row, quantized once the warp has it all
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) staged[warp][lane + 32 * i] = e[i];
    quantize_staged();
  }
}

}  // namespace

cudaError_t launch_qk_norm_rope_store(float* q, const float* k, const float* v, const void* q_norm,
                                      const void* k_norm, DType norm_dtype, float eps, const RopeParams& rope,
                                      const int32_t* start_pos, void* k_cache, void* v_cache, DType cache_dtype,
                                      int T, int n_heads, int n_kv_heads, int head_dim, const KvTables& tables,
                                      cudaStream_t stream) {
  dim3 grid(ceil_div(n_heads + 2 * n_kv_heads, kWarps), T);
  cudaError_t inner = cudaSuccess;
  cudaError_t outer = visit_float(norm_dtype, [&]<typename N>() {
    inner = visit_float(cache_dtype, [&]<typename C>() {
      launch_kernel(qk_norm_rope_store_kernel<N, C, 0>, grid, kWarps * 32, 0, stream,
          q, k, v, static_cast<const N*>(q_norm), static_cast<const N*>(k_norm), eps, rope, start_pos,
          static_cast<C*>(k_cache), static_cast<C*>(v_cache), AffineScales{}, n_heads, n_kv_heads, head_dim, tables);
    });
  });
  return inner != cudaSuccess ? inner : outer;
}

cudaError_t launch_qk_norm_rope_store_affine(float* q, const float* k, const float* v, const void* q_norm,
                                             const void* k_norm, DType norm_dtype, float eps, const RopeParams& rope,
                                             const int32_t* start_pos, const AffineKvOut& cache, int T, int n_heads,
                                             int n_kv_heads, int head_dim, const KvTables& tables,
                                             cudaStream_t stream) {
  const int group = head_dim < kKvQuantGroup ? head_dim : kKvQuantGroup;
  if ((cache.bits != 8 && cache.bits != 4) || group % 2 || head_dim % group) return cudaErrorInvalidValue;
  dim3 grid(ceil_div(n_heads + 2 * n_kv_heads, kWarps), T);
  const AffineScales scales{static_cast<uint16_t*>(cache.k_scales), static_cast<uint16_t*>(cache.k_biases),
                            static_cast<uint16_t*>(cache.v_scales), static_cast<uint16_t*>(cache.v_biases)};
  return visit_float(norm_dtype, [&]<typename N>() {
    auto go = [&]<int kBits>() {
      launch_kernel(qk_norm_rope_store_kernel<N, uint8_t, kBits>, grid, kWarps * 32, 0, stream,
          q, k, v, static_cast<const N*>(q_norm), static_cast<const N*>(k_norm), eps, rope, start_pos,
          static_cast<uint8_t*>(cache.k_codes), static_cast<uint8_t*>(cache.v_codes), scales, n_heads, n_kv_heads,
          head_dim, tables);
    };
    if (cache.bits == 8) go.template operator()<8>();
    else go.template operator()<4>();
  });
}

}  // namespace mere::cuda
