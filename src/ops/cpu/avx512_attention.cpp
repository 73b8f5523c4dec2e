// Lever cpu_avx512_attention: a prefill tile's attention (attention.cpp's tile:
// the query heads of one kv head at a few tokens) as two outer products in
// 512-bit registers. Scores: a block of keys packed transposed (dimension-major,
// 16 keys to a vector), so a step loads 3 key vectors and broadcasts one query
// dimension of each of 8 rows into 24 sums of 16 keys each, stored as they are
// (the AVX2 form takes dot products, 8 lanes reduced per score). Weighted
// values: a block of value rows contiguous, a step loads 4 vectors of a value
// row and broadcasts one weight of each of 6 rows. Both blocks stay in L1 for
// every row of the tile; a layer's keys and values are laid out so once for all
// the tiles of a kv head. The softmax between them in 512-bit registers too.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>

#include "ops/cpu/attention_tile.h"
#include "ops/cpu/avx512.h"
#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {
namespace {

std::atomic<bool> g_avx512_attention{false};
std::atomic<int64_t> g_avx512_attention_tiles{0};

}  // namespace

void set_avx512_attention(bool on) { g_avx512_attention = on; }
int64_t avx512_attention_tiles() { return g_avx512_attention_tiles; }
void count_avx512_attention_tile() { ++g_avx512_attention_tiles; }
bool avx512_attention_applies() { return g_avx512_attention && avx512_matmul_available(); }

#ifdef MERE_CPU_AVX512

namespace {

constexpr int64_t kLanes = 16;
// A block of keys or values: 8,192 floats (32 KB) stay in L1 beside the rows.
constexpr int64_t kPackFloats = 8192;

int64_t keys_a_block(int64_t head_dim) { return std::max(kLanes, kPackFloats / head_dim / kLanes * kLanes); }

// scores of R rows against key vectors [0, V) of a packed block (kt: head_dim
// rows of `width` keys), into out[i] + 16 v.
template <int R, int V>
MERE_AVX512_TARGET inline __attribute__((always_inline)) void score_tile(const QueryRow* rows, const float* kt,
                                                                         int64_t width, int64_t head_dim, float scale,
                                                                         float* out, int64_t stride) {
  __m512 acc[R][V];
  #pragma GCC unroll 8
  for (auto& a : acc)
    #pragma GCC unroll 4
    for (auto& x : a) x = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; ++d) {
    __m512 keys[V];
    #pragma GCC unroll 4
    for (int v = 0; v < V; ++v) keys[v] = _mm512_loadu_ps(kt + d * width + v * kLanes);
    #pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 q = _mm512_set1_ps(rows[i].q[d]);
      #pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_fmadd_ps(q, keys[v], acc[i][v]);
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
  #pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
    #pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(out + i * stride + v * kLanes, _mm512_mul_ps(acc[i][v], s));
}

// R rows against the first `vectors` key vectors of the block: 3 at a time, then the rest.
template <int R>
MERE_AVX512_TARGET void score_rows(const QueryRow* rows, const float* kt, int64_t width, int64_t vectors,
                                   int64_t head_dim, float scale, float* out, int64_t stride) {
  int64_t v = 0;
  for (; v + 3 <= vectors; v += 3) score_tile<R, 3>(rows, kt + v * kLanes, width, head_dim, scale, out + v * kLanes, stride);
  if (vectors - v == 2) score_tile<R, 2>(rows, kt + v * kLanes, width, head_dim, scale, out + v * kLanes, stride);
  if (vectors - v == 1) score_tile<R, 1>(rows, kt + v * kLanes, width, head_dim, scale, out + v * kLanes, stride);
}

// Keys [s0, s1) of the cache transposed into kt [head_dim][width], one gather
// a dimension and 16 keys; keys past s1 (up to width) 0.
MERE_AVX512_TARGET void pack_keys_transposed(const KvHead& kv, int64_t s0, int64_t s1, int64_t width, float* kt) {
  const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(int32_t(kv.row)));
  for (int64_t s = s0; s < s0 + width; s += kLanes) {
    const int64_t present = std::clamp<int64_t>(s1 - s, 0, kLanes);
    const __mmask16 mask = __mmask16((1u << present) - 1);
    const float* first = kv.k + s * kv.row;
    for (int64_t d = 0; d < kv.head_dim; ++d)
      _mm512_storeu_ps(kt + d * width + (s - s0),
                       _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, rows, first + d, sizeof(float)));
  }
}

// out_i[d0, d0 + 16 V) += sum over keys [0, n) of w_i[s] * vp[s] for R rows, the
// last vector's lanes outside `tail` untouched.
template <int R, int V>
MERE_AVX512_TARGET inline __attribute__((always_inline)) void value_tile(const QueryRow* rows, const float* weights,
                                                                         int64_t stride, const float* vp,
                                                                         int64_t head_dim, int64_t n, int64_t d0,
                                                                         __mmask16 tail) {
  __m512 acc[R][V];
  #pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
    #pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      acc[i][v] = _mm512_maskz_loadu_ps(v == V - 1 ? tail : __mmask16(0xffff), rows[i].out + d0 + v * kLanes);
  for (int64_t s = 0; s < n; ++s) {
    __m512 values[V];
    #pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      values[v] = _mm512_maskz_loadu_ps(v == V - 1 ? tail : __mmask16(0xffff), vp + s * head_dim + d0 + v * kLanes);
    #pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 w = _mm512_set1_ps(weights[i * stride + s]);
      #pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_fmadd_ps(w, values[v], acc[i][v]);
    }
  }
  #pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
    #pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      _mm512_mask_storeu_ps(rows[i].out + d0 + v * kLanes, v == V - 1 ? tail : __mmask16(0xffff), acc[i][v]);
}

// R rows over the keys [0, n) of a packed value block, head_dim in 4 vectors
// at a time, then one at a time (the last masked).
template <int R>
MERE_AVX512_TARGET void value_rows(const QueryRow* rows, const float* weights, int64_t stride, const float* vp,
                                   int64_t head_dim, int64_t n) {
  int64_t d0 = 0;
  for (; d0 + 4 * kLanes <= head_dim; d0 += 4 * kLanes)
    value_tile<R, 4>(rows, weights, stride, vp, head_dim, n, d0, __mmask16(0xffff));
  for (; d0 < head_dim; d0 += kLanes) {
    const int64_t lanes = std::min(kLanes, head_dim - d0);
    value_tile<R, 1>(rows, weights, stride, vp, head_dim, n, d0, __mmask16((1u << lanes) - 1));
  }
}

// e^x for x <= 0 (attention_tile.h's polynomial), 16 lanes.
MERE_AVX512_TARGET inline __attribute__((always_inline)) __m512 exp_nonpositive(__m512 x) {
  const __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpFloor), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(kExpFloor));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  #pragma GCC unroll 6
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i power = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(kept, p, _mm512_castsi512_ps(power));
}

// Rows [0, n_rows) in groups of kGroup, the rest in 4, 2 and 1: fn(R, first row).
template <int kGroup, class Fn>
void in_groups(int64_t n_rows, Fn fn) {
  int64_t j = 0;
  for (; j + kGroup <= n_rows; j += kGroup) fn(std::integral_constant<int, kGroup>(), j);
  if (n_rows - j >= 4) fn(std::integral_constant<int, 4>(), j), j += 4;
  if (n_rows - j >= 2) fn(std::integral_constant<int, 2>(), j), j += 2;
  if (n_rows - j >= 1) fn(std::integral_constant<int, 1>(), j);
}

}  // namespace

MERE_AVX512_TARGET float avx512_softmax_weights(float* scores, int64_t n, float& top) {
  __m512 most = _mm512_set1_ps(-INFINITY);
  for (int64_t s = 0; s < n; s += kLanes) {
    const __mmask16 mask = __mmask16((1u << std::min(kLanes, n - s)) - 1);
    most = _mm512_mask_max_ps(most, mask, most, _mm512_maskz_loadu_ps(mask, scores + s));
  }
  top = _mm512_reduce_max_ps(most);
  const __m512 shift = _mm512_set1_ps(top);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t s = 0; s < n; s += kLanes) {
    const __mmask16 mask = __mmask16((1u << std::min(kLanes, n - s)) - 1);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, scores + s), shift));
    _mm512_mask_storeu_ps(scores + s, mask, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(mask, e));
  }
  return 1.0f / _mm512_reduce_add_ps(sum);
}

// The layout's sizes, and its values contiguous (converted to f32).
template <class E>
void lay_out_values(const KvHeadOf<E>& kv, int64_t n_keys, WideKvHead& wide) {
  wide.n_keys = n_keys, wide.head_dim = kv.head_dim, wide.scale = kv.scale;
  wide.block = keys_a_block(kv.head_dim);
  const int64_t n_blocks = (n_keys + wide.block - 1) / wide.block;
  wide.keys.resize(size_t(n_blocks * wide.block * kv.head_dim));
  wide.values.resize(size_t(n_keys * kv.head_dim));
  for (int64_t s = 0; s < n_keys; ++s)
    for (int64_t d = 0; d < kv.head_dim; ++d) {
      if constexpr (std::is_same_v<E, float>)
        wide.values[size_t(s * kv.head_dim + d)] = kv.v[s * kv.row + d];
      else
        wide.values[size_t(s * kv.head_dim + d)] = bf16_to_f32(kv.v[s * kv.row + d]);
    }
}

MERE_AVX512_TARGET void pack_wide_kv_head(const KvHead& kv, int64_t n_keys, WideKvHead& wide) {
  lay_out_values(kv, n_keys, wide);
  for (int64_t b0 = 0; b0 < n_keys; b0 += wide.block)
    pack_keys_transposed(kv, b0, std::min(b0 + wide.block, n_keys), wide.block, wide.keys.data() + b0 * kv.head_dim);
}

// bf16 rows: transposed one value at a time (the layout is once a layer; the tiles dominate).
void pack_wide_kv_head(const Bf16KvHead& kv, int64_t n_keys, WideKvHead& wide) {
  lay_out_values(kv, n_keys, wide);
  for (int64_t b0 = 0; b0 < n_keys; b0 += wide.block) {
    float* kt = wide.keys.data() + b0 * kv.head_dim;
    const int64_t b1 = std::min(b0 + wide.block, n_keys);
    for (int64_t d = 0; d < kv.head_dim; ++d) {
      for (int64_t s = b0; s < b1; ++s) kt[d * wide.block + (s - b0)] = bf16_to_f32(kv.k[s * kv.row + d]);
      std::fill(kt + d * wide.block + (b1 - b0), kt + (d + 1) * wide.block, 0.0f);
    }
  }
}

MERE_AVX512_TARGET void avx512_tile_scores(const WideKvHead& kv, const QueryRow* rows, int64_t n_rows, float* scores,
                                           int64_t stride) {
  const int64_t n_keys = rows[n_rows - 1].n_keys;
  for (int64_t b0 = 0; b0 < n_keys; b0 += kv.block) {
    const int64_t b1 = std::min(b0 + kv.block, n_keys);
    const float* kt = kv.keys.data() + b0 * kv.head_dim;
    in_groups<8>(n_rows, [&](auto rows_a_group, int64_t j) {
      constexpr int R = decltype(rows_a_group)::value;
      const int64_t s1 = std::min(b1, rows[j + R - 1].n_keys);
      if (b0 >= s1) return;
      score_rows<R>(rows + j, kt, kv.block, (s1 - b0 + kLanes - 1) / kLanes, kv.head_dim, kv.scale,
                    scores + j * stride + b0, stride);
    });
  }
}

MERE_AVX512_TARGET void avx512_tile_values(const WideKvHead& kv, const QueryRow* rows, int64_t n_rows,
                                           const float* weights, int64_t stride) {
  const int64_t n_keys = rows[n_rows - 1].n_keys;
  for (int64_t s0 = 0; s0 < n_keys; s0 += kv.block) {
    const int64_t s1 = std::min(s0 + kv.block, n_keys);
    in_groups<6>(n_rows, [&](auto rows_a_group, int64_t j) {
      constexpr int R = decltype(rows_a_group)::value;
      const int64_t end = std::min(s1, rows[j + R - 1].n_keys);
      if (s0 >= end) return;
      value_rows<R>(rows + j, weights + j * stride + s0, stride, kv.values.data() + s0 * kv.head_dim, kv.head_dim,
                    end - s0);
    });
  }
}

#else

float avx512_softmax_weights(float*, int64_t, float&) { return 0.0f; }
void pack_wide_kv_head(const KvHead&, int64_t, WideKvHead&) {}
void pack_wide_kv_head(const Bf16KvHead&, int64_t, WideKvHead&) {}
void avx512_tile_scores(const WideKvHead&, const QueryRow*, int64_t, float*, int64_t) {}
void avx512_tile_values(const WideKvHead&, const QueryRow*, int64_t, const float*, int64_t) {}

#endif

}  // namespace mere::ops::cpu
