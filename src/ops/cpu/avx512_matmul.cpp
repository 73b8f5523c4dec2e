// Lever cpu_avx512_matmul: the tiled prefill product (tiled_rows_product's f32
// rows times the tokens) in 512-bit registers where the CPU has AVX-512F. The
// 32 registers hold a tile of 4 rows by 6 tokens (24 sums, the 6 tokens' x and a
// row's weights), so a step of 16 columns loads 10 vectors for 24 multiply-adds
// and the FMA units, not the loads, set the pace; the AVX2 tile (2 rows by 4
// tokens in 16 registers) loads 6 for 8. Runtime dispatch: the functions carry
// their own target attribute, and run only where the CPU reports AVX-512F.
#include <algorithm>
#include <atomic>

#include "ops/cpu/avx512.h"
#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {
namespace {

std::atomic<bool> g_avx512_matmul{false};
std::atomic<int64_t> g_avx512_blocks{0};

}  // namespace

void set_avx512_matmul(bool on) { g_avx512_matmul = on; }
int64_t avx512_matmul_blocks() { return g_avx512_blocks; }

#ifdef MERE_CPU_AVX512

bool avx512_matmul_available() {
  static const bool available = __builtin_cpu_supports("avx512f");
  return available;
}

namespace {

constexpr int64_t kTokensAPass = 6, kRowsATile = 4;

// One step of a tile: columns [i, i + 16) of kRows rows times T tokens, the
// columns outside `mask` read as 0.
template <int T, int kRows>
MERE_AVX512_TARGET inline __attribute__((always_inline)) void tile_step(const float* x, int64_t in, const float* rows,
                                                                        int64_t r, int64_t i, __mmask16 mask,
                                                                        __m512 (&acc)[kRows][T]) {
  __m512 xt[T];
  #pragma GCC unroll 8
  for (int t = 0; t < T; ++t) xt[t] = _mm512_maskz_loadu_ps(mask, x + t * in + i);
  #pragma GCC unroll 8
  for (int k = 0; k < kRows; ++k) {
    const __m512 w = _mm512_maskz_loadu_ps(mask, rows + (r + k) * in + i);
    #pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[k][t] = _mm512_fmadd_ps(w, xt[t], acc[k][t]);
  }
}

// out[t, r + k] = rows[r + k] . x[t] (+ bias) for kRows rows and T tokens; the
// last step's columns past `in` masked off, so any width runs.
template <int T, int kRows>
MERE_AVX512_TARGET void tile(const float* x, int64_t in, const float* rows, int64_t r, const float* bias, float* out,
                             int64_t n_out) {
  __m512 acc[kRows][T];
  #pragma GCC unroll 8
  for (auto& a : acc)
    #pragma GCC unroll 8
    for (auto& v : a) v = _mm512_setzero_ps();
  const int64_t body = in & ~int64_t(15);
  for (int64_t i = 0; i < body; i += 16) tile_step<T, kRows>(x, in, rows, r, i, __mmask16(0xffff), acc);
  if (body < in) tile_step<T, kRows>(x, in, rows, r, body, __mmask16((1u << (in - body)) - 1), acc);
  #pragma GCC unroll 8
  for (int k = 0; k < kRows; ++k)
    #pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const float y = _mm512_reduce_add_ps(acc[k][t]);
      out[t * n_out + r + k] = bias ? y + bias[r + k] : y;
    }
}

// All rows for T tokens: tiles of 4 rows, then the rest one at a time.
template <int T>
MERE_AVX512_TARGET void tokens_pass(const float* x, int64_t in, const float* rows, int64_t n_rows, const float* bias,
                                    float* out, int64_t n_out) {
  int64_t r = 0;
  for (; r + kRowsATile <= n_rows; r += kRowsATile) tile<T, kRowsATile>(x, in, rows, r, bias, out, n_out);
  for (; r < n_rows; ++r) tile<T, 1>(x, in, rows, r, bias, out, n_out);
}

MERE_AVX512_TARGET void rows_product(const float* x, int64_t T, int64_t in, const float* rows, int64_t n_rows,
                                     const float* bias, float* out, int64_t n_out) {
  for (int64_t t0 = 0; t0 < T; t0 += kTokensAPass) {
    const float* xt = x + t0 * in;
    float* o = out + t0 * n_out;
    switch (std::min(kTokensAPass, T - t0)) {
      case 1: tokens_pass<1>(xt, in, rows, n_rows, bias, o, n_out); break;
      case 2: tokens_pass<2>(xt, in, rows, n_rows, bias, o, n_out); break;
      case 3: tokens_pass<3>(xt, in, rows, n_rows, bias, o, n_out); break;
      case 4: tokens_pass<4>(xt, in, rows, n_rows, bias, o, n_out); break;
      case 5: tokens_pass<5>(xt, in, rows, n_rows, bias, o, n_out); break;
      default: tokens_pass<6>(xt, in, rows, n_rows, bias, o, n_out); break;
    }
  }
}

}  // namespace

bool avx512_rows_product(const float* x, int64_t T, int64_t in, const float* rows, int64_t n_rows, const float* bias,
                         float* out, int64_t n_out) {
  if (!g_avx512_matmul || !avx512_matmul_available()) return false;
  rows_product(x, T, in, rows, n_rows, bias, out, n_out);
  ++g_avx512_blocks;
  return true;
}

#else

bool avx512_matmul_available() { return false; }
bool avx512_rows_product(const float*, int64_t, int64_t, const float*, int64_t, const float*, float*, int64_t) {
  return false;
}

#endif

}  // namespace mere::ops::cpu
