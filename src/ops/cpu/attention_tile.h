// The pieces of a CPU attention tile that attention.cpp shares with its
// 512-bit form (avx512_attention.cpp).
#pragma once

#include <cstdint>
#include <vector>

namespace mere::ops::cpu {

// One kv head's cache, rows of f32 or bf16 (E float or uint16_t): key s at
// k + s * row, value s at v + s * row.
template <class E>
struct KvHeadOf {
  const E* k;
  const E* v;
  int64_t row, head_dim;
  float scale;
};
using KvHead = KvHeadOf<float>;
using Bf16KvHead = KvHeadOf<uint16_t>;

// One query row of a tile: a query head at one token, the keys it sees
// [0, n_keys) and where its output goes. A tile's rows see non-decreasing keys.
struct QueryRow {
  const float* q;
  float* out;
  int64_t n_keys;
};

// e^x for x <= 0 (scores less their max), at either vector width: x = n ln2 + r,
// |r| <= ln2 / 2 (ln 2 in two parts, Cody-Waite), e^r = 1 + r + r^2 p(r) with p
// of degree 5 (about 2 ulp), 2^n into the exponent; below kExpFloor 0 (e^-87 < 2^-126).
inline constexpr float kLog2e = 1.44269504088896341f, kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;
inline constexpr float kExpFloor = -87.0f;
inline constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                      4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// Lever cpu_avx512_attention: a prefill tile's scores and weighted values as
// outer products in 512-bit registers; true where the lever is on and the CPU
// has AVX-512F. avx512_attention_tiles counts the tiles it served.
bool avx512_attention_applies();
void count_avx512_attention_tile();

// One kv head's first n_keys keys and values laid out for the 512-bit tiles,
// once per layer and kv head for all its tiles: the keys in blocks of `block`,
// each transposed ([head_dim][block], 16 keys to a vector; keys past n_keys 0),
// the values contiguous ([n_keys][head_dim]; in the cache a row lies a whole
// cache row away, where a block's rows share a few L1 sets).
struct WideKvHead {
  std::vector<float> keys, values;
  int64_t n_keys = 0, head_dim = 0, block = 0;
  float scale = 0;
};
void pack_wide_kv_head(const KvHead& kv, int64_t n_keys, WideKvHead& wide);
void pack_wide_kv_head(const Bf16KvHead& kv, int64_t n_keys, WideKvHead& wide);

// scores[j * stride + s] = q_j . k_s * scale for the tile's rows and keys s below
// the n_keys of the last row of j's group of rows, rounded up to 16 (stride, a
// multiple of 16, at least the last row's n_keys rounded up): a step broadcasts
// one dimension of each of 8 rows against 3 vectors of 16 keys. Scores past a
// row's own n_keys are its group's, not its own.
void avx512_tile_scores(const WideKvHead& kv, const QueryRow* rows, int64_t n_rows, float* scores, int64_t stride);

// scores -> e^(score - max) in place over [0, n); returns 1 / their sum, and the
// max in `top` (attention.cpp's softmax_weights in 512-bit registers).
float avx512_softmax_weights(float* scores, int64_t n, float& top);

// out_j += sum over keys s of weights[j * stride + s] * v_s for the tile's rows,
// the keys of each group of rows up to its last row's n_keys (a row's weights
// past its own n_keys must be 0): a step broadcasts one weight of each of 6 rows
// against 4 vectors of a value row.
void avx512_tile_values(const WideKvHead& kv, const QueryRow* rows, int64_t n_rows, const float* weights,
                        int64_t stride);

}  // namespace mere::ops::cpu
