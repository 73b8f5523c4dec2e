// Attention on the CPU: q [T, heads, head_dim] against the cache's first
// pos0 + t + 1 keys for token t (causal), f32 throughout.
//
// Lever cpu_vector_attention: one task per (token, kv head) takes the query
// heads that share it, so each key and value row is read once for all of them
// (the scalar form reads them once per query head); scores, softmax and the
// weighted values in AVX2 registers, 4 keys a step for the scores and 32 value
// dimensions a step for the sums over blocks of 64 keys, the rows 64 keys ahead
// prefetched into L2 (a kv head's rows lie a whole cache row apart, a stride
// the hardware prefetcher does not follow across pages; into L1 the fill
// buffers ran out first); exp by a polynomial (about 2 ulp).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MERE_CPU_VECTOR_ATTENTION 1
#endif

#include "core/thread_pool.h"
#include "ops/cpu/avx2.h"
#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {
namespace {

std::atomic<bool> g_vector_attention{false};
std::atomic<int64_t> g_vector_attention_runs{0};

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

// e^x for x <= 0 (scores less their max): x = n ln2 + r, |r| <= ln2 / 2, e^r by
// a degree-6 polynomial, 2^n into the exponent; below -87 (e^x < 2^-126) 0.
__m256 exp_nonpositive(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln 2 in two parts (Cody-Waite)
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i power = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(power)));
}

// The four sums of a[0..3], each over its 8 lanes.
__m128 four_sums(const __m256 (&a)[4]) {
  const __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 s = _mm256_hadd_ps(s01, s23);  // per 128-bit half: a0 a1 a2 a3 partial sums
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

struct HeadGroup {
  const float* q;  // kHeads query rows of head_dim, head_dim apart
  const float* k;  // key s of this kv head at k + s * row
  const float* v;
  int64_t row, head_dim, n_keys;
  float scale;
};

// scores[j * n_keys + s] = q_j . k_s * scale for kHeads heads, 4 keys a step.
template <int kHeads>
void head_scores(const HeadGroup& g, float* scores) {
  int64_t s = 0;
  for (; s + 4 <= g.n_keys; s += 4) {
    #pragma GCC unroll 4
    for (int u = 0; u < 4; ++u)
      for (int64_t i = 0; i < g.head_dim; i += 16)
        _mm_prefetch(reinterpret_cast<const char*>(g.k + (s + u + kScoreAhead) * g.row + i), _MM_HINT_T1);
    __m256 acc[kHeads][4];
    #pragma GCC unroll 4
    for (auto& a : acc)
      #pragma GCC unroll 4
      for (auto& x : a) x = _mm256_setzero_ps();
    for (int64_t i = 0; i < g.head_dim; i += 8) {
      __m256 key[4];
      #pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) key[u] = _mm256_loadu_ps(g.k + (s + u) * g.row + i);
      #pragma GCC unroll 4
      for (int j = 0; j < kHeads; ++j) {
        const __m256 qv = _mm256_loadu_ps(g.q + j * g.head_dim + i);
        #pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) acc[j][u] = _mm256_fmadd_ps(qv, key[u], acc[j][u]);
      }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < kHeads; ++j)
      _mm_storeu_ps(scores + j * g.n_keys + s, _mm_mul_ps(four_sums(acc[j]), _mm_set1_ps(g.scale)));
  }
  for (; s < g.n_keys; ++s)
    #pragma GCC unroll 4
    for (int j = 0; j < kHeads; ++j)
      scores[j * g.n_keys + s] = dot(g.q + j * g.head_dim, g.k + s * g.row, g.head_dim) * g.scale;
}

// scores -> e^(score - max) in place; returns 1 / their sum.
float softmax_weights(float* scores, int64_t n) {
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
  return 1.0f / total;
}

// Keys a block of the weighted sum: its value rows stay in L1/L2 while the
// passes over their head_dim take them 32 dimensions at a time, so each row is
// fetched from memory whole, once.
constexpr int64_t kKeysABlock = 64;

// out_j[i0, i0 + 8 kVectors) (+)= sum over keys [s0, s1) of weights[j][s] v_s[...]
// (from 0 in the first block). The first pass over a block's rows asks for the
// rows kValueAhead keys on, whole.
template <int kHeads, int kVectors>
void weighted_values(const HeadGroup& g, const float* weights, int64_t s0, int64_t s1, int64_t i0, float* out) {
  __m256 acc[kHeads][kVectors];
  #pragma GCC unroll 4
  for (int j = 0; j < kHeads; ++j)
    #pragma GCC unroll 4
    for (int u = 0; u < kVectors; ++u)
      acc[j][u] = s0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(out + j * g.head_dim + i0 + 8 * u);
  for (int64_t s = s0; s < s1; ++s) {
    if (i0 == 0)
      for (int64_t i = 0; i < g.head_dim; i += 16)
        _mm_prefetch(reinterpret_cast<const char*>(g.v + (s + kValueAhead) * g.row + i), _MM_HINT_T1);
    __m256 value[kVectors];
    #pragma GCC unroll 4
    for (int u = 0; u < kVectors; ++u) value[u] = _mm256_loadu_ps(g.v + s * g.row + i0 + 8 * u);
    #pragma GCC unroll 4
    for (int j = 0; j < kHeads; ++j) {
      const __m256 p = _mm256_broadcast_ss(weights + j * g.n_keys + s);
      #pragma GCC unroll 4
      for (int u = 0; u < kVectors; ++u) acc[j][u] = _mm256_fmadd_ps(p, value[u], acc[j][u]);
    }
  }
  #pragma GCC unroll 4
  for (int j = 0; j < kHeads; ++j)
    #pragma GCC unroll 4
    for (int u = 0; u < kVectors; ++u) _mm256_storeu_ps(out + j * g.head_dim + i0 + 8 * u, acc[j][u]);
}

// kHeads query heads of one kv head: the whole of attention for them.
template <int kHeads>
void attend_heads(const HeadGroup& g, std::vector<float>& scores, float* out) {
  scores.resize(size_t(kHeads * g.n_keys));
  head_scores<kHeads>(g, scores.data());
  float inv_sum[kHeads];
  #pragma GCC unroll 4
  for (int j = 0; j < kHeads; ++j) inv_sum[j] = softmax_weights(scores.data() + j * g.n_keys, g.n_keys);
  for (int64_t s0 = 0; s0 < g.n_keys; s0 += kKeysABlock) {
    const int64_t s1 = std::min(g.n_keys, s0 + kKeysABlock);
    int64_t i0 = 0;
    for (; i0 + 32 <= g.head_dim; i0 += 32) weighted_values<kHeads, 4>(g, scores.data(), s0, s1, i0, out);
    for (; i0 < g.head_dim; i0 += 8) weighted_values<kHeads, 1>(g, scores.data(), s0, s1, i0, out);
  }
  #pragma GCC unroll 4
  for (int j = 0; j < kHeads; ++j)
    for (int64_t i = 0; i < g.head_dim; i += 8)
      _mm256_storeu_ps(out + j * g.head_dim + i,
                       _mm256_mul_ps(_mm256_loadu_ps(out + j * g.head_dim + i), _mm256_set1_ps(inv_sum[j])));
}

bool vector_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale, Tensor& out) {
  const int64_t T = q.dim(0), n_heads = q.dim(1), head_dim = q.dim(2), n_kv_heads = k.dim(1);
  if (!g_vector_attention || head_dim % 8 != 0) return false;
  const int64_t group = n_heads / n_kv_heads;
  parallel_for(T * n_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / n_kv_heads, kv_h = task % n_kv_heads;
      // Query heads in pairs: their sums, a step's keys or values and a query fit the 16 registers.
      for (int64_t j = 0; j < group; j += 2) {
        const int64_t h = kv_h * group + j;
        const HeadGroup g{q.data<float>() + (t * n_heads + h) * head_dim,
                          k.data<float>() + kv_h * head_dim,
                          v.data<float>() + kv_h * head_dim,
                          n_kv_heads * head_dim,
                          head_dim,
                          pos0 + t + 1,
                          scale};
        float* o = out.data<float>() + (t * n_heads + h) * head_dim;
        if (group - j >= 2)
          attend_heads<2>(g, scores, o);
        else
          attend_heads<1>(g, scores, o);
      }
    }
  });
  ++g_vector_attention_runs;
  return true;
}

#else

bool vector_attention(const Tensor&, const Tensor&, const Tensor&, int64_t, float, Tensor&) { return false; }

#endif

}  // namespace

void set_vector_attention(bool on) { g_vector_attention = on; }
int64_t vector_attention_runs() { return g_vector_attention_runs; }

void attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale, Tensor& out) {
  if (!vector_attention(q, k, v, pos0, scale, out)) scalar_attention(q, k, v, pos0, scale, out);
}

}  // namespace mere::ops::cpu
