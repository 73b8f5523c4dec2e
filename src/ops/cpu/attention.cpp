// Attention on the CPU: q [T, heads, head_dim] against the cache's first
// pos0 + t + 1 keys for token t (causal), in f32; the cache rows f32 or bf16
// (the vector forms widen bf16 in registers), or affine8/affine4 codes (a decode
// step's tiles dequantize a block of rows at a time into L1; elsewhere the
// visible rows are dequantized to f32 first).
//
// Lever cpu_vector_attention: one task per tile (the query heads that share a
// kv head, at up to 64 / group consecutive tokens) reads each key and value row
// once for all its query rows (the scalar form reads them once per query head
// and token); scores, softmax and the weighted values in AVX2 registers, 3-4
// keys a step for the scores and 32 value dimensions a step for the sums. A
// decode step's tile (one token) reads the cache in place, the rows 64 keys
// ahead prefetched into L2 (a kv head's rows lie a whole cache row apart, a
// stride the hardware prefetcher does not follow across pages; into L1 the fill
// buffers ran out first); a prefill's tiles copy blocks of keys and values into
// L1 and take their scores against them four rows at a time. exp by a
// polynomial (about 2 ulp).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MERE_CPU_VECTOR_ATTENTION 1
#endif

#include "core/thread_pool.h"
#include "ops/cpu/attention_tile.h"
#include "ops/cpu/avx2.h"
#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {
namespace {

std::atomic<bool> g_vector_attention{false};
std::atomic<int64_t> g_vector_attention_runs{0}, g_decode_run_splits{0}, g_code_reads{0};

// One task per (token, query head): scores over the visible keys, a max-shifted
// softmax in f32, then the weighted sum of values.
void scalar_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale, Tensor& out) {
  const int64_t T = q.dim(0), n_heads = q.dim(1), head_dim = q.dim(2), n_kv_heads = k.dim(1);
  const int64_t group = n_heads / n_kv_heads;
  parallel_for(T * n_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / n_heads, h = task % n_heads, kv_h = h / group;
      const int64_t n_keys = pos0 + t + 1;
      const float* qv = q.data<float>() + (t * n_heads + h) * head_dim;
      scores.resize(size_t(n_keys));
      float max_score = -INFINITY;
      for (int64_t s = 0; s < n_keys; ++s) {
        const float* kv = k.data<float>() + (s * n_kv_heads + kv_h) * head_dim;
        scores[size_t(s)] = dot(qv, kv, head_dim) * scale;
        max_score = std::max(max_score, scores[size_t(s)]);
      }
      float sum = 0;
      for (auto& s : scores) sum += (s = std::exp(s - max_score));
      float* o = out.data<float>() + (t * n_heads + h) * head_dim;
      std::fill(o, o + head_dim, 0.0f);
      for (int64_t s = 0; s < n_keys; ++s) {
        const float* vv = v.data<float>() + (s * n_kv_heads + kv_h) * head_dim;
        float p = scores[size_t(s)] / sum;
        for (int64_t i = 0; i < head_dim; ++i) o[i] += p * vv[i];
      }
    }
  });
}

#ifdef MERE_CPU_VECTOR_ATTENTION

// Keys ahead whose rows a step asks for: the scores' step and the values' step.
constexpr int64_t kScoreAhead = 64, kValueAhead = 64;

// e^x for x <= 0 (attention_tile.h's polynomial).
__m256 exp_nonpositive(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(kExpFloor), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(kExpFloor));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2High), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Low), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i power = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(power)));
}

// 8 of the cache's values as f32: f32 rows as they are, bf16 rows widened (a
// bf16 is the high half of an f32).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// Elements of a cache row in one 64-byte line: a prefetch a line.
template <class E>
constexpr int64_t kPerLine = 64 / int64_t(sizeof(E));

// The four sums of a[0..3], each over its 8 lanes.
__m128 four_sums(const __m256 (&a)[4]) {
  const __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 s = _mm256_hadd_ps(s01, s23);  // per 128-bit half: a0 a1 a2 a3 partial sums
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// scores[j * stride + s] = q_j . k_s * scale for kHeads rows and keys [s0, s1),
// kKeys keys a step (4 rows by 3 keys or 2 by 4 fill the 16 registers with a
// query and the step's keys); the rows `prefetch` asks for are kScoreAhead keys on.
template <int kHeads, int kKeys = 4, class E = float>
void head_scores(const KvHeadOf<E>& kv, const QueryRow* rows, int64_t s0, int64_t s1, bool prefetch, float* scores,
                 int64_t stride) {
  static_assert(kKeys == 3 || kKeys == 4);
  int64_t s = s0;
  for (; s + kKeys <= s1; s += kKeys) {
    if (prefetch)
      #pragma GCC unroll 4
      for (int u = 0; u < kKeys; ++u)
        for (int64_t i = 0; i < kv.head_dim; i += kPerLine<E>)
          _mm_prefetch(reinterpret_cast<const char*>(kv.k + (s + u + kScoreAhead) * kv.row + i), _MM_HINT_T1);
    __m256 acc[kHeads][4];
    #pragma GCC unroll 4
    for (auto& a : acc)
      #pragma GCC unroll 4
      for (auto& x : a) x = _mm256_setzero_ps();
    for (int64_t i = 0; i < kv.head_dim; i += 8) {
      __m256 key[kKeys];
      #pragma GCC unroll 4
      for (int u = 0; u < kKeys; ++u) key[u] = load8(kv.k + (s + u) * kv.row + i);
      #pragma GCC unroll 4
      for (int j = 0; j < kHeads; ++j) {
        const __m256 qv = _mm256_loadu_ps(rows[j].q + i);
        #pragma GCC unroll 4
        for (int u = 0; u < kKeys; ++u) acc[j][u] = _mm256_fmadd_ps(qv, key[u], acc[j][u]);
      }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < kHeads; ++j) {
      const __m128 sums = _mm_mul_ps(four_sums(acc[j]), _mm_set1_ps(kv.scale));
      if constexpr (kKeys == 4)
        _mm_storeu_ps(scores + j * stride + s, sums);
      else
        _mm_maskstore_ps(scores + j * stride + s, _mm_setr_epi32(-1, -1, -1, 0), sums);
    }
  }
  for (; s < s1; ++s)
    #pragma GCC unroll 4
    for (int j = 0; j < kHeads; ++j) {
      float d = 0;
      if constexpr (std::is_same_v<E, float>)
        d = dot(rows[j].q, kv.k + s * kv.row, kv.head_dim);
      else
        for (int64_t i = 0; i < kv.head_dim; ++i) d += rows[j].q[i] * bf16_to_f32(kv.k[s * kv.row + i]);
      scores[j * stride + s] = d * kv.scale;
    }
}

// scores -> e^(score - max) in place; returns 1 / their sum, and the max in `top`.
float softmax_weights(float* scores, int64_t n, float& top_score) {
  __m256 top = _mm256_set1_ps(-INFINITY);
  int64_t s = 0;
  for (; s + 8 <= n; s += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(scores + s));
  float max_score = -INFINITY;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top);
  for (float l : lanes) max_score = std::max(max_score, l);
  for (int64_t r = s; r < n; ++r) max_score = std::max(max_score, scores[r]);
  const __m256 shift = _mm256_set1_ps(max_score);
  __m256 sum = _mm256_setzero_ps();
  for (s = 0; s + 8 <= n; s += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(scores + s), shift));
    _mm256_storeu_ps(scores + s, e);
    sum = _mm256_add_ps(sum, e);
  }
  float total = horizontal_sum(sum);
  for (; s < n; ++s) total += (scores[s] = std::exp(scores[s] - max_score));
  top_score = max_score;
  return 1.0f / total;
}

// Keys a block of the scores: a block's key rows (128 KB at head_dim 128) stay
// in L2 while every row pair of a tile takes its scores against them.
constexpr int64_t kScoreBlock = 256;

// Keys a block of the weighted sum: its value rows stay in L1/L2 while the
// passes over their head_dim take them 32 dimensions at a time for every row
// pair, so each row is fetched from memory whole, once.
constexpr int64_t kKeysABlock = 64;

// out_j[i0, i0 + 8 kVectors) += sum over keys [s0, s1) of weights[j][s] v_s[...].
// With `prefetch`, the first pass over a block's rows asks for the rows
// kValueAhead keys on, whole.
template <int kHeads, int kVectors, class E = float>
void weighted_values(const KvHeadOf<E>& kv, const QueryRow* rows, const float* weights, int64_t stride, int64_t s0,
                     int64_t s1, int64_t i0, bool prefetch) {
  __m256 acc[kHeads][kVectors];
  #pragma GCC unroll 4
  for (int j = 0; j < kHeads; ++j)
    #pragma GCC unroll 4
    for (int u = 0; u < kVectors; ++u) acc[j][u] = _mm256_loadu_ps(rows[j].out + i0 + 8 * u);
  for (int64_t s = s0; s < s1; ++s) {
    if (prefetch && i0 == 0)
      for (int64_t i = 0; i < kv.head_dim; i += kPerLine<E>)
        _mm_prefetch(reinterpret_cast<const char*>(kv.v + (s + kValueAhead) * kv.row + i), _MM_HINT_T1);
    __m256 value[kVectors];
    #pragma GCC unroll 4
    for (int u = 0; u < kVectors; ++u) value[u] = load8(kv.v + s * kv.row + i0 + 8 * u);
    #pragma GCC unroll 4
    for (int j = 0; j < kHeads; ++j) {
      const __m256 p = _mm256_broadcast_ss(weights + j * stride + s);
      #pragma GCC unroll 4
      for (int u = 0; u < kVectors; ++u) acc[j][u] = _mm256_fmadd_ps(p, value[u], acc[j][u]);
    }
  }
  #pragma GCC unroll 4
  for (int j = 0; j < kHeads; ++j)
    #pragma GCC unroll 4
    for (int u = 0; u < kVectors; ++u) _mm256_storeu_ps(rows[j].out + i0 + 8 * u, acc[j][u]);
}

// The weighted values of rows [j, j + kHeads) of a tile over keys [s0, s1).
template <int kHeads, class E>
void pair_values(const KvHeadOf<E>& kv, const QueryRow* rows, const float* weights, int64_t stride, int64_t s0,
                 int64_t s1, bool prefetch) {
  int64_t i0 = 0;
  for (; i0 + 32 <= kv.head_dim; i0 += 32)
    weighted_values<kHeads, 4, E>(kv, rows, weights, stride, s0, s1, i0, prefetch);
  for (; i0 < kv.head_dim; i0 += 8) weighted_values<kHeads, 1, E>(kv, rows, weights, stride, s0, s1, i0, prefetch);
}

// Rows [s0, s1) of one side of a kv head's cache (keys or values) copied
// contiguous into `pack`. In the cache they lie a whole cache row apart (4 KB
// and more), so a block of them shares a few L1 sets and falls back to L2;
// contiguous, a block of kPackFloats stays in L1 for every row pair of a tile.
constexpr int64_t kPackFloats = 8192;

template <class E>
void pack_rows(const E* side, int64_t row, int64_t head_dim, int64_t s0, int64_t s1, float* pack) {
  for (int64_t s = s0; s < s1; ++s) {
    for (int64_t i = 0; i < head_dim; i += kPerLine<E>)
      _mm_prefetch(reinterpret_cast<const char*>(side + (s + kScoreAhead) * row + i), _MM_HINT_T1);
    if constexpr (std::is_same_v<E, float>)
      std::copy_n(side + s * row, head_dim, pack + (s - s0) * head_dim);
    else
      for (int64_t i = 0; i < head_dim; i += 8) _mm256_storeu_ps(pack + (s - s0) * head_dim + i, load8(side + s * row + i));
  }
}

// One kv head's rows of a quantized cache (ops.h AffineRows: value = scale *
// code + bias per group), from key `first` on: key s's codes at codes + s *
// code_row, its groups' scales and biases at scales / biases + s * group_row.
struct AffineKvHead {
  struct Side {
    const uint8_t* codes;
    const uint16_t* scales;
    const uint16_t* biases;
  };
  Side k, v;
  int64_t code_row, group_row, head_dim, group;
  int bits;
  float scale;
};

AffineKvHead affine_head(const AffineRows& k, const AffineRows& v, int64_t kv_h, int64_t first, float scale) {
  const int64_t head_dim = k.head_dim(), groups = k.scales.dim(2), code_bytes = head_dim * k.bits / 8;
  const int64_t code_row = k.heads() * code_bytes, group_row = k.heads() * groups;
  auto side = [&](const AffineRows& rows) {
    return AffineKvHead::Side{rows.codes.data<uint8_t>() + first * code_row + kv_h * code_bytes,
                              rows.scales.data<uint16_t>() + first * group_row + kv_h * groups,
                              rows.biases.data<uint16_t>() + first * group_row + kv_h * groups};
  };
  return {side(k), side(v), code_row, group_row, head_dim, head_dim / groups, k.bits, scale};
}

// 8 codes as f32: 8-bit codes from 8 bytes; 4-bit ones (the first in the low
// nibble) from 4.
inline __m256 codes8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m128i nibbles_to_bytes(__m128i packed) {  // 8 bytes -> their 16 nibbles a byte each, in order
  const __m128i wide = _mm_cvtepu8_epi16(packed);
  return _mm_or_si128(_mm_and_si128(wide, _mm_set1_epi16(0xf)), _mm_slli_epi16(_mm_srli_epi16(wide, 4), 8));
}

// Rows [s0, s1) of one side of a quantized kv head dequantized into `pack`
// (contiguous f32 rows), each value scale * code + bias as dequantize_kv_rows
// computes it; the code rows kScoreAhead keys on prefetched into L2. Its own
// loops in AVX2: dequantize_kv_rows's scalar loop, called a row at a time here,
// ran 2.7x (8-bit) and 4.5x (4-bit) slower.
template <int kBits>
void unpack_rows(const AffineKvHead& kv, const AffineKvHead::Side& side, int64_t s0, int64_t s1, float* pack) {
  // Locals: the stores into `pack` could alias kv's fields for the compiler.
  const int64_t head_dim = kv.head_dim, group = kv.group, code_row = kv.code_row, group_row = kv.group_row;
  const int64_t code_bytes = head_dim * kBits / 8, groups = head_dim / group;
  for (int64_t s = s0; s < s1; ++s) {
    const uint8_t* codes = side.codes + s * code_row;
    for (int64_t i = 0; i < code_bytes; i += 64)
      _mm_prefetch(reinterpret_cast<const char*>(codes + kScoreAhead * code_row + i), _MM_HINT_T1);
    float* out = pack + (s - s0) * head_dim;
    for (int64_t g = 0; g < groups; ++g) {
      const __m256 scale = _mm256_set1_ps(bf16_to_f32(side.scales[s * group_row + g]));
      const __m256 bias = _mm256_set1_ps(bf16_to_f32(side.biases[s * group_row + g]));
      const uint8_t* c = codes + g * group * kBits / 8;
      float* o = out + g * group;
      auto put = [&](int64_t i, __m256 code) {
        _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_mul_ps(scale, code), bias));
      };
      int64_t i = 0;
      if constexpr (kBits == 8) {
        for (; i < group; i += 8) put(i, codes8(c + i));
      } else {
        for (; i + 16 <= group; i += 16) {
          const __m128i bytes = nibbles_to_bytes(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + i / 2)));
          put(i, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)));
          put(i + 8, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8))));
        }
        if (i < group) {  // a group of 8 more: 4 bytes
          int32_t four;
          std::memcpy(&four, c + i / 2, 4);
          put(i, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nibbles_to_bytes(_mm_cvtsi32_si128(four)))));
        }
      }
    }
  }
}

// A block of keys (or values) of a kv head as contiguous f32 rows: dense rows
// copied (bf16 widened), quantized ones dequantized.
template <class E>
void pack_side(const KvHeadOf<E>& kv, bool values, int64_t s0, int64_t s1, float* pack) {
  pack_rows(values ? kv.v : kv.k, kv.row, kv.head_dim, s0, s1, pack);
}
void pack_side(const AffineKvHead& kv, bool values, int64_t s0, int64_t s1, float* pack) {
  const AffineKvHead::Side& side = values ? kv.v : kv.k;
  if (kv.bits == 8)
    unpack_rows<8>(kv, side, s0, s1, pack);
  else
    unpack_rows<4>(kv, side, s0, s1, pack);
}

// out_j *= factors[j]: each row's weighted values by 1 / the sum of its weights.
void scale_rows_by(const QueryRow* rows, int64_t n_rows, int64_t head_dim, const std::vector<float>& factors) {
  for (int64_t j = 0; j < n_rows; ++j) {
    const __m256 factor = _mm256_set1_ps(factors[size_t(j)]);
    for (int64_t i = 0; i < head_dim; i += 8)
      _mm256_storeu_ps(rows[j].out + i, _mm256_mul_ps(_mm256_loadu_ps(rows[j].out + i), factor));
  }
}

// A thread's buffers for its tiles, kept from one tile to the next.
struct TileBuffers {
  std::vector<float> scores, pack, inv_sum;
};

// The whole of attention for a tile's query rows (the query heads of one kv
// head at a few consecutive tokens, token-major), taken in pairs: their sums, a
// step's keys or values and a query fit the 16 registers. A pair's scores run
// to the later row's keys; the earlier row's weights past its own keys are 0.
// A tile of one pair reads the cache in place; a larger one copies each block
// of keys and of values into L1 first and serves every pair from there, so a
// prefill reads the cache once a tile rather than once a query row.
// With `tops` and `sums`, each row's largest score and its sum of e^(score - top)
// go there (to merge runs of keys). With `wide` (lever cpu_avx512_attention: the
// kv head laid out for it), a tile of 8 rows or more takes the 512-bit form.
// Kv: KvHeadOf<E> (dense rows) or AffineKvHead (codes, always packed: a block is
// dequantized once for every row of the tile).
template <class Kv>
void attend_tile(const Kv& kv, const QueryRow* rows, int64_t n_rows, TileBuffers& buffers,
                 float* tops = nullptr, float* sums = nullptr, const WideKvHead* wide_kv = nullptr) {
  constexpr bool kInPlace = !std::is_same_v<Kv, AffineKvHead>;
  std::vector<float>& scores = buffers.scores;
  std::vector<float>& pack = buffers.pack;
  std::vector<float>& inv_sum = buffers.inv_sum;
  const bool packed = n_rows > 2 || !kInPlace, wide = wide_kv && n_rows >= 8;
  // The 512-bit form stores scores 16 keys at a time.
  const int64_t stride = wide ? (rows[n_rows - 1].n_keys + 15) / 16 * 16 : rows[n_rows - 1].n_keys;
  scores.resize(size_t(n_rows * stride));
  auto pair_keys = [&](int64_t j) { return rows[std::min(j + 1, n_rows - 1)].n_keys; };
  if (wide) {
    count_avx512_attention_tile();
    avx512_tile_scores(*wide_kv, rows, n_rows, scores.data(), stride);
    inv_sum.resize(static_cast<size_t>(n_rows));
    for (int64_t j = 0; j < n_rows; ++j) {  // the values run to their group's keys: the rest of a row's weights 0
      float* weights = scores.data() + j * stride;
      float top = 0;
      inv_sum[size_t(j)] = avx512_softmax_weights(weights, rows[j].n_keys, top);
      if (tops) tops[j] = top, sums[j] = 1.0f / inv_sum[size_t(j)];
      std::fill(weights + rows[j].n_keys, weights + stride, 0.0f);
      std::fill(rows[j].out, rows[j].out + kv.head_dim, 0.0f);
    }
    avx512_tile_values(*wide_kv, rows, n_rows, scores.data(), stride);
    scale_rows_by(rows, n_rows, kv.head_dim, inv_sum);
    return;
  }
  const int64_t block = packed ? std::max<int64_t>(16, kPackFloats / kv.head_dim) : kScoreBlock;
  if (packed) pack.resize(size_t(block * kv.head_dim));
  const KvHead in_pack{pack.data(), pack.data(), kv.head_dim, kv.head_dim, kv.scale};
  for (int64_t b0 = 0; b0 < stride; b0 += block) {
    if (packed) {  // rows in fours, the rest in a pair and a single
      pack_side(kv, false, b0, std::min(b0 + block, stride), pack.data());
      for (int64_t j = 0, width = 0; j < n_rows; j += width) {
        width = n_rows - j >= 4 ? 4 : n_rows - j >= 2 ? 2 : 1;
        const int64_t s1 = std::min(b0 + block, rows[j + width - 1].n_keys);
        if (b0 >= s1) continue;
        float* from = scores.data() + j * stride + b0;
        if (width == 4)
          head_scores<4, 3>(in_pack, rows + j, 0, s1 - b0, false, from, stride);
        else if (width == 2)
          head_scores<2>(in_pack, rows + j, 0, s1 - b0, false, from, stride);
        else
          head_scores<1>(in_pack, rows + j, 0, s1 - b0, false, from, stride);
      }
      continue;
    }
    if constexpr (kInPlace)
      for (int64_t j = 0; j < n_rows; j += 2) {
        const int64_t s1 = std::min(b0 + block, pair_keys(j));
        if (b0 >= s1) continue;
        float* from = scores.data() + j * stride;
        if (n_rows - j >= 2)
          head_scores<2, 4>(kv, rows + j, b0, s1, j == 0, from, stride);
        else
          head_scores<1, 4>(kv, rows + j, b0, s1, j == 0, from, stride);
      }
  }
  inv_sum.resize(static_cast<size_t>(n_rows));
  for (int64_t j = 0; j < n_rows; ++j) {
    float* weights = scores.data() + j * stride;
    float top = 0;
    inv_sum[size_t(j)] = softmax_weights(weights, rows[j].n_keys, top);
    if (tops) tops[j] = top, sums[j] = 1.0f / inv_sum[size_t(j)];
    std::fill(weights + rows[j].n_keys, weights + pair_keys(j & ~int64_t(1)), 0.0f);
    std::fill(rows[j].out, rows[j].out + kv.head_dim, 0.0f);
  }
  const int64_t value_block = packed ? block : kKeysABlock;
  for (int64_t s0 = 0; s0 < stride; s0 += value_block) {
    if (packed) pack_side(kv, true, s0, std::min(s0 + value_block, stride), pack.data());
    for (int64_t j = 0; j < n_rows; j += 2) {
      const int64_t s1 = std::min(s0 + value_block, pair_keys(j));
      if (s0 >= s1) continue;
      const float* weights = scores.data() + j * stride;
      const int two = n_rows - j >= 2;
      if (packed && two)
        pair_values<2>(in_pack, rows + j, weights + s0, stride, 0, s1 - s0, false);
      else if (packed)
        pair_values<1>(in_pack, rows + j, weights + s0, stride, 0, s1 - s0, false);
      else if constexpr (kInPlace) {
        if (two)
          pair_values<2>(kv, rows + j, weights, stride, s0, s1, true);
        else
          pair_values<1>(kv, rows + j, weights, stride, s0, s1, true);
      }
    }
  }
  scale_rows_by(rows, n_rows, kv.head_dim, inv_sum);
}

// Query rows a tile aims at: enough to reuse each packed block many times
// (8, 16, 32 and 64 rows: 69, 84, 90 and 99 GFLOP/s in a 2,048-token prefill
// on 2 cores, before the scores took rows in fours),
// with the tile's scores (rows x keys) held under kScoreFloats (16 MB).
constexpr int64_t kRowsATile = 64, kScoreFloats = int64_t(1) << 22;

// A decode step's keys in runs of at least kMinRunKeys where its kv heads are
// fewer than the threads: each (kv head, run) a task, their outputs merged by
// their rows' largest scores and sums (flash-decoding), so every thread reads
// a share of the cache.
constexpr int64_t kMinRunKeys = 256;

// A dense cache's kv head from key `first` on.
template <class E>
KvHeadOf<E> dense_head(const Tensor& k, const Tensor& v, int64_t kv_h, int64_t first, float scale) {
  const int64_t head_dim = k.dim(2), row = k.dim(1) * head_dim;
  return {k.data<E>() + first * row + kv_h * head_dim, v.data<E>() + first * row + kv_h * head_dim, row, head_dim,
          scale};
}

// head_at(kv_h, first): kv head kv_h of the cache from key `first` on (a
// KvHeadOf<E> or an AffineKvHead).
template <class HeadAt>
void decode_in_runs(const Tensor& q, HeadAt head_at, int64_t n_kv_heads, int64_t n_keys, int64_t runs, Tensor& out) {
  const int64_t n_heads = q.dim(1), head_dim = q.dim(2), group = n_heads / n_kv_heads;
  std::vector<float> partial(static_cast<size_t>(n_heads * runs * head_dim));
  std::vector<float> tops(static_cast<size_t>(n_heads * runs)), sums(tops.size());
  parallel_for(n_kv_heads * runs, 1, [&](int64_t begin, int64_t end) {
    TileBuffers buffers;
    std::vector<QueryRow> rows(static_cast<size_t>(group));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kv_h = task / runs, run = task % runs;
      const int64_t s0 = n_keys * run / runs, s1 = n_keys * (run + 1) / runs;
      for (int64_t j = 0; j < group; ++j)
        rows[size_t(j)] = {q.data<float>() + (kv_h * group + j) * head_dim,
                           partial.data() + (task * group + j) * head_dim, s1 - s0};
      attend_tile(head_at(kv_h, s0), rows.data(), group, buffers, tops.data() + task * group,
                  sums.data() + task * group);
    }
  });
  for (int64_t h = 0; h < n_heads; ++h) {  // each run's output weighs its share of the whole softmax
    const int64_t kv_h = h / group, j = h % group;
    auto at = [&](int64_t run) { return (kv_h * runs + run) * group + j; };
    float top = -INFINITY, total = 0;
    for (int64_t run = 0; run < runs; ++run) top = std::max(top, tops[size_t(at(run))]);
    float* o = out.data<float>() + h * head_dim;
    std::fill(o, o + head_dim, 0.0f);
    for (int64_t run = 0; run < runs; ++run) {
      const float weight = sums[size_t(at(run))] * std::exp(tops[size_t(at(run))] - top);
      const float* part = partial.data() + at(run) * head_dim;
      for (int64_t i = 0; i < head_dim; ++i) o[i] += weight * part[i];
      total += weight;
    }
    for (int64_t i = 0; i < head_dim; ++i) o[i] /= total;
  }
  ++g_decode_run_splits;
}

// How a call's work is cut: a decode step's key runs (1: none), and tiles of
// tile_tokens consecutive tokens of a kv head.
struct TilePlan {
  int64_t runs, tile_tokens, n_tiles;
  bool wide;  // lever cpu_avx512_attention: the tiles take the 512-bit form
};
TilePlan plan_tiles(const Tensor& q, int64_t n_kv_heads, int64_t pos0) {
  const int64_t T = q.dim(0), group = q.dim(1) / n_kv_heads;
  const int64_t runs = T == 1 ? std::min((thread_count() + n_kv_heads - 1) / n_kv_heads, (pos0 + 1) / kMinRunKeys) : 1;
  const int64_t tile_tokens = std::max<int64_t>(1, std::min(kRowsATile / group, kScoreFloats / (group * (pos0 + T))));
  return {std::max<int64_t>(runs, 1), tile_tokens, (T + tile_tokens - 1) / tile_tokens,
          T > 1 && group * std::min(T, tile_tokens) >= 8 && avx512_attention_applies()};
}

// Every tile of the call, one task each; `wide` holds the kv heads laid out for
// the 512-bit form where plan.wide.
template <class HeadAt>
void attend_tiles(const Tensor& q, HeadAt head_at, int64_t n_kv_heads, int64_t pos0, const TilePlan& plan,
                  const std::vector<WideKvHead>& wide, Tensor& out) {
  const int64_t T = q.dim(0), n_heads = q.dim(1), head_dim = q.dim(2), group = n_heads / n_kv_heads;
  parallel_for(plan.n_tiles * n_kv_heads, 1, [&](int64_t begin, int64_t end) {
    TileBuffers buffers;
    std::vector<QueryRow> rows;
    for (int64_t task = begin; task < end; ++task) {
      // The last tiles see the most keys: they go first, so the chunks even out.
      const int64_t tile = plan.n_tiles - 1 - task / n_kv_heads, kv_h = task % n_kv_heads;
      rows.clear();
      for (int64_t t = tile * plan.tile_tokens; t < std::min(T, (tile + 1) * plan.tile_tokens); ++t)
        for (int64_t j = 0; j < group; ++j) {
          const int64_t at = (t * n_heads + kv_h * group + j) * head_dim;
          rows.push_back({q.data<float>() + at, out.data<float>() + at, pos0 + t + 1});
        }
      attend_tile(head_at(kv_h, 0), rows.data(), int64_t(rows.size()), buffers, nullptr, nullptr,
                  wide.empty() ? nullptr : &wide[size_t(kv_h)]);
    }
  });
}

// E: the cache's element, float (f32) or uint16_t (bf16).
template <class E>
void vector_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale, Tensor& out) {
  const int64_t n_kv_heads = k.dim(1);
  auto head_at = [&](int64_t kv_h, int64_t first) { return dense_head<E>(k, v, kv_h, first, scale); };
  const TilePlan plan = plan_tiles(q, n_kv_heads, pos0);
  if (plan.runs > 1) return decode_in_runs(q, head_at, n_kv_heads, pos0 + 1, plan.runs, out);
  // Lever cpu_avx512_attention: each kv head's keys and values laid out for it
  // once, for all its tiles (a tile of 8 query rows or more; a decode step's
  // tiles are its group).
  std::vector<WideKvHead> wide;
  if (plan.wide) {
    wide.resize(size_t(n_kv_heads));
    parallel_for(n_kv_heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t kv_h = begin; kv_h < end; ++kv_h)
        pack_wide_kv_head(head_at(kv_h, 0), pos0 + q.dim(0), wide[size_t(kv_h)]);
    });
  }
  attend_tiles(q, head_at, n_kv_heads, pos0, plan, wide, out);
}

bool vector_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale, Tensor& out) {
  if (!g_vector_attention || q.dim(2) % 8 != 0 || (k.dtype() != DType::f32 && k.dtype() != DType::bf16)) return false;
  ++g_vector_attention_runs;
  if (k.dtype() == DType::bf16)
    vector_attention<uint16_t>(q, k, v, pos0, scale, out);
  else
    vector_attention<float>(q, k, v, pos0, scale, out);
  return true;
}

// A quantized cache read as stored where each kv head's rows are read by one
// tile (a decode step, a few tokens): its blocks dequantized into L1 as the tile
// goes. Several tiles would dequantize the rows once each, and the 512-bit form
// lays its kv heads out from f32 rows: false there, and the caller dequantizes
// the visible rows once.
bool vector_attention(const Tensor& q, const AffineRows& k, const AffineRows& v, int64_t pos0, float scale,
                      Tensor& out) {
  if (!g_vector_attention || q.dim(2) % 8 != 0) return false;
  const int64_t n_kv_heads = k.heads();
  const TilePlan plan = plan_tiles(q, n_kv_heads, pos0);
  if (plan.runs == 1 && (plan.n_tiles > 1 || plan.wide)) return false;
  ++g_vector_attention_runs;
  ++g_code_reads;
  auto head_at = [&](int64_t kv_h, int64_t first) { return affine_head(k, v, kv_h, first, scale); };
  if (plan.runs > 1)
    decode_in_runs(q, head_at, n_kv_heads, pos0 + 1, plan.runs, out);
  else
    attend_tiles(q, head_at, n_kv_heads, pos0, plan, {}, out);
  return true;
}

#else

bool vector_attention(const Tensor&, const Tensor&, const Tensor&, int64_t, float, Tensor&) { return false; }
bool vector_attention(const Tensor&, const AffineRows&, const AffineRows&, int64_t, float, Tensor&) { return false; }

#endif

}  // namespace

void set_vector_attention(bool on) { g_vector_attention = on; }
int64_t vector_attention_runs() { return g_vector_attention_runs; }
int64_t attention_decode_run_splits() { return g_decode_run_splits; }
int64_t attention_code_reads() { return g_code_reads; }

void attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale, Tensor& out) {
  if (vector_attention(q, k, v, pos0, scale, out)) return;
  if (k.dtype() == DType::f32) return scalar_attention(q, k, v, pos0, scale, out);
  // bf16 rows the vector form did not take: an f32 copy of the visible ones.
  const int64_t n = pos0 + q.dim(0);
  scalar_attention(q, k.slice_rows(0, n).to(DType::f32), v.slice_rows(0, n).to(DType::f32), pos0, scale, out);
}

void attention(const Tensor& q, const AffineRows& k, const AffineRows& v, int64_t pos0, float scale, Tensor& out) {
  if (vector_attention(q, k, v, pos0, scale, out)) return;
  const int64_t n = pos0 + q.dim(0);
  Tensor kd = Tensor::empty({n, k.heads(), k.head_dim()}, DType::f32);
  Tensor vd = Tensor::empty({n, v.heads(), v.head_dim()}, DType::f32);
  dequantize_kv_rows(k, n, kd);
  dequantize_kv_rows(v, n, vd);
  attention(q, kd, vd, pos0, scale, out);
}

}  // namespace mere::ops::cpu
