// Lever cpu_packed_matmul: the tiled prefill product as an outer product in
// 512-bit registers. The tokens are packed once per matmul, 16 to a vector
// ([T / 16][in][16], tiled_tokens); a step of the kernel loads 3 such vectors
// (48 tokens) and broadcasts one weight of each of 8 rows into 24 sums, so 11
// loads feed 24 multiply-adds and no horizontal sum is left to do (the dot-product
// tiles of avx512_matmul.cpp load 10 vectors for 24 and reduce each sum at the
// end). The columns run in chunks of 512, so a tile's 8 rows (16 KB) stay in L1
// while every token of a block of 192 passes them; each chunk's sums are added
// into out.
#include <algorithm>
#include <atomic>

#include "core/thread_pool.h"
#include "ops/cpu/avx512.h"
#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {
namespace {

std::atomic<bool> g_packed_matmul{false};
std::atomic<int64_t> g_packed_blocks{0};

// Below this the dot-product tiles keep up (measured on 384-wide rows, whose
// tiles fit in L1; from 1,024 columns the packed form led from 32 tokens) and the
// packing would not pay for itself.
constexpr int64_t kMinTokens = 64;

}  // namespace

void set_packed_matmul(bool on) { g_packed_matmul = on; }
int64_t packed_matmul_blocks() { return g_packed_blocks; }

#ifdef MERE_CPU_AVX512

namespace {

constexpr int64_t kLanes = 16, kRowsATile = 8, kVectorsATile = 3, kColumnsAChunk = 512, kTokensABlock = 192;

// A block's product: packed tokens times row-major f32 rows into out.
struct Product {
  const float* packed;  // [groups][in][16]
  int64_t T, in;
  const float* rows;  // [n_rows][in]
  const float* bias;  // [n_rows] or null
  float* out;         // [T][n_out], the block's first column
  int64_t n_out;
};

// Columns [k0, k0 + kc) of rows [r, r + R) times the tokens of groups [g, g + V),
// written into out (the first chunk, with the bias) or added to it.
template <int V, int R>
MERE_AVX512_TARGET inline __attribute__((always_inline)) void tile(const Product& p, int64_t r, int64_t g, int64_t k0,
                                                                   int64_t kc) {
  __m512 acc[R][V];
  #pragma GCC unroll 8
  for (auto& a : acc)
    #pragma GCC unroll 4
    for (auto& v : a) v = _mm512_setzero_ps();
  const float* x = p.packed + (g * p.in + k0) * kLanes;
  const float* w = p.rows + r * p.in + k0;
  for (int64_t k = 0; k < kc; ++k) {
    __m512 xv[V];
    #pragma GCC unroll 4
    for (int v = 0; v < V; ++v) xv[v] = _mm512_loadu_ps(x + v * p.in * kLanes + k * kLanes);
    #pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 wi = _mm512_set1_ps(w[i * p.in + k]);
      #pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_fmadd_ps(wi, xv[v], acc[i][v]);
    }
  }
  alignas(64) float sums[R][V * kLanes];
  #pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
    #pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_store_ps(sums[i] + v * kLanes, acc[i][v]);
  const int64_t t0 = g * kLanes, tokens = std::min<int64_t>(V * kLanes, p.T - t0);
  float* o = p.out + t0 * p.n_out + r;
  if constexpr (R == 8) {  // a token's 8 sums gathered into one vector
    const __m256i rows = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i offsets = _mm256_mullo_epi32(rows, _mm256_set1_epi32(V * kLanes));
    const __m256 bias = p.bias ? _mm256_loadu_ps(p.bias + r) : _mm256_setzero_ps();
    for (int64_t t = 0; t < tokens; ++t, o += p.n_out) {
      const __m256 s = _mm256_i32gather_ps(&sums[0][t], offsets, sizeof(float));
      _mm256_storeu_ps(o, _mm256_add_ps(s, k0 == 0 ? bias : _mm256_loadu_ps(o)));
    }
  } else {
    for (int64_t t = 0; t < tokens; ++t, o += p.n_out)
      for (int i = 0; i < R; ++i) o[i] = sums[i][t] + (k0 > 0 ? o[i] : p.bias ? p.bias[r + i] : 0.0f);
  }
}

// Rows [r, r + R) over the token groups [g0, g1): tiles of 3 groups, then the rest.
template <int R>
MERE_AVX512_TARGET void rows_over_tokens(const Product& p, int64_t r, int64_t g0, int64_t g1, int64_t k0, int64_t kc) {
  int64_t g = g0;
  for (; g + kVectorsATile <= g1; g += kVectorsATile) tile<kVectorsATile, R>(p, r, g, k0, kc);
  if (g1 - g == 2) tile<2, R>(p, r, g, k0, kc);
  if (g1 - g == 1) tile<1, R>(p, r, g, k0, kc);
}

MERE_AVX512_TARGET void block_product(const Product& p, int64_t n_rows) {
  const int64_t groups = (p.T + kLanes - 1) / kLanes, groups_a_block = kTokensABlock / kLanes;
  for (int64_t g0 = 0; g0 < groups; g0 += groups_a_block) {
    const int64_t g1 = std::min(groups, g0 + groups_a_block);
    for (int64_t k0 = 0; k0 < p.in; k0 += kColumnsAChunk) {
      const int64_t kc = std::min(kColumnsAChunk, p.in - k0);
      int64_t r = 0;
      for (; r + kRowsATile <= n_rows; r += kRowsATile) rows_over_tokens<kRowsATile>(p, r, g0, g1, k0, kc);
      if (n_rows - r >= 4) rows_over_tokens<4>(p, r, g0, g1, k0, kc), r += 4;
      if (n_rows - r >= 2) rows_over_tokens<2>(p, r, g0, g1, k0, kc), r += 2;
      if (n_rows - r >= 1) rows_over_tokens<1>(p, r, g0, g1, k0, kc);
    }
  }
}

// Group g's 16 tokens, column by column: one gather a column, tokens past T as 0.
MERE_AVX512_TARGET void pack_group(const float* x, int64_t T, int64_t in, int64_t g, float* dst) {
  const int64_t tokens = std::min(kLanes, T - g * kLanes);
  const __mmask16 present = __mmask16((1u << tokens) - 1);
  const __m512i token_offsets =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(int32_t(in)));
  const float* src = x + g * kLanes * in;
  for (int64_t k = 0; k < in; ++k)
    _mm512_storeu_ps(dst + k * kLanes,
                     _mm512_mask_i32gather_ps(_mm512_setzero_ps(), present, token_offsets, src + k, sizeof(float)));
}

}  // namespace

TiledTokens tiled_tokens(const float* x, int64_t T, int64_t in) {
  TiledTokens tokens{x, T, in, Tensor()};
  // The gather's offsets (up to 15 rows of `in`) are 32-bit.
  if (!g_packed_matmul || !tiled_matmul_applies() || !avx512_matmul_available() || T < kMinTokens ||
      in > (int64_t(1) << 26))
    return tokens;
  const int64_t groups = (T + kLanes - 1) / kLanes;
  tokens.packed = Tensor::empty({groups, in, kLanes}, DType::f32);
  float* packed = tokens.packed.data<float>();
  const int64_t groups_a_task = std::max<int64_t>(1, (int64_t(1) << 16) / (in * kLanes));  // 256 KB or more a task
  parallel_for(groups, groups_a_task, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) pack_group(x, T, in, g, packed + g * in * kLanes);
  });
  return tokens;
}

bool packed_rows_product(const TiledTokens& x, const float* rows, int64_t n_rows, const float* bias, float* out,
                         int64_t n_out) {
  if (!x.packed.defined()) return false;
  block_product({x.packed.data<float>(), x.T, x.in, rows, bias, out, n_out}, n_rows);
  ++g_packed_blocks;
  return true;
}

#else

TiledTokens tiled_tokens(const float* x, int64_t T, int64_t in) { return {x, T, in, Tensor()}; }
bool packed_rows_product(const TiledTokens&, const float*, int64_t, const float*, float*, int64_t) { return false; }

#endif

}  // namespace mere::ops::cpu
