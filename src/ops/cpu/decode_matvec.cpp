// Decode matvecs on the CPU (lever cpu_direct_matvec): x [T <= 8, in] f32 against
// the weights as they are stored (f32/f16/bf16 rows, MLX affine int8/int4 codes,
// FP8 E4M3 with 128x128 block scales).
// Each 8 weights are converted to f32 in AVX2 registers and used for up to 4
// tokens at once (5-8 take a second pass over each chunk of rows, from L2), a
// few rows at a time so that x's loads serve several rows. The staged
// forms (cpu::linear, cpu::affine_linear) write a block of rows out as f32 first,
// which pays where the rows serve many tokens (prefill) but at one token costs
// several times what reading the weights does.
//
// The affine form keeps the fused dequantize-dot of cpu::affine_linear: per
// group, scale * sum(q * x) + bias * sum(x), with sum(x) per group once per token.
//
// The f32 kernel also serves prefill (lever cpu_tiled_matmul): the staged forms'
// blocks of rows, converted once, multiplied by the tokens 4 at a time.
#include <algorithm>
#include <atomic>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define MERE_CPU_DIRECT_MATVEC 1
#endif

#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/avx2.h"
#include "ops/quantized_ops.h"

namespace mere::ops::cpu {
namespace {

std::atomic<bool> g_direct_matvec{false}, g_tiled_matmul{false};
std::atomic<int64_t> g_direct_matvec_runs{0}, g_tiled_blocks{0};

}  // namespace

void set_direct_matvec(bool on) { g_direct_matvec = on; }
int64_t direct_matvec_runs() { return g_direct_matvec_runs; }
void set_tiled_matmul(bool on) { g_tiled_matmul = on; }
int64_t tiled_matmul_blocks() { return g_tiled_blocks; }

#ifdef MERE_CPU_DIRECT_MATVEC
namespace {

constexpr int64_t kMaxTokens = 8;
// A pass takes up to 4 tokens (its sums fill the registers); more tokens take
// another pass over each chunk of rows, from L2 the second time.
constexpr int64_t kTokensPerPass = 4;
constexpr int64_t kRowsPerChunk = 64;

template <int kRows, int T>
void zero(__m256 (&sums)[kRows][T]) {
  #pragma GCC unroll 8
  for (int k = 0; k < kRows; ++k)
    #pragma GCC unroll 8
    for (int t = 0; t < T; ++t) sums[k][t] = _mm256_setzero_ps();
}

// Weights i..i+7 of a dense row stored as kType, as f32; and weight i alone.
template <DType kType>
__m256 load8(const void* row, int64_t i) {
  if constexpr (kType == DType::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i));
    if constexpr (kType == DType::f16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16: the high half of f32
  }
}
template <DType kType>
float load1(const void* row, int64_t i) {
  if constexpr (kType == DType::f32) return static_cast<const float*>(row)[i];
  if constexpr (kType == DType::f16) return f16_to_f32(static_cast<const uint16_t*>(row)[i]);
  return bf16_to_f32(static_cast<const uint16_t*>(row)[i]);
}

// kRows rows [r, r + kRows) of a dense weight times T tokens: the rows share each
// load of x, and kRows * T independent sums hide the multiply-add latency.
template <DType kType, int T, int kRows>
void dense_rows(const float* x, int64_t in, const uint8_t* w, size_t row_bytes, int64_t r, const float* bias,
                float* out, int64_t n_out) {
  __m256 acc[kRows][T];
  zero(acc);
  const int64_t body = in & ~int64_t(7);
  constexpr int64_t kLine = 64, kElemsPerLine = kLine / (kType == DType::f32 ? 4 : 2);
  for (int64_t i = 0; i < body; i += 8) {
    if (i % kElemsPerLine == 0)  // the next rows' line, as with the codes in affine_rows
      #pragma GCC unroll 8
      for (int k = 0; k < kRows; ++k)
        _mm_prefetch(reinterpret_cast<const char*>(w + (r + k + kRows) * row_bytes) + i * (kLine / kElemsPerLine),
                     _MM_HINT_T0);
    __m256 xt[T];
    #pragma GCC unroll 8
    for (int t = 0; t < T; ++t) xt[t] = _mm256_loadu_ps(x + t * in + i);
    #pragma GCC unroll 8
    for (int k = 0; k < kRows; ++k) {
      const __m256 wv = load8<kType>(w + (r + k) * row_bytes, i);
      #pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[k][t] = _mm256_fmadd_ps(wv, xt[t], acc[k][t]);
    }
  }
  #pragma GCC unroll 8
  for (int k = 0; k < kRows; ++k)
    #pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      float y = horizontal_sum(acc[k][t]);
      for (int64_t i = body; i < in; ++i) y += load1<kType>(w + (r + k) * row_bytes, i) * x[t * in + i];
      out[t * n_out + r + k] = bias ? y + bias[r + k] : y;
    }
}

// Rows [r0, r1): as many blocks of the widest kRows as fit, the rest one by one.
// kRows * T stays at 8 or fewer sums, so the sums, x and a weight fit the 16 registers.
template <DType kType, int T>
void dense_span(const float* x, int64_t in, const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1,
                const float* bias, float* out, int64_t n_out) {
  constexpr int kRows = T <= 2 ? 4 : 2;
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) dense_rows<kType, T, kRows>(x, in, w, row_bytes, r, bias, out, n_out);
  for (; r < r1; ++r) dense_rows<kType, T, 1>(x, in, w, row_bytes, r, bias, out, n_out);
}

template <DType kType>
void dense_span(int64_t T, const float* x, int64_t in, const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1,
                const float* bias, float* out, int64_t n_out) {
  switch (T) {
    case 1: return dense_span<kType, 1>(x, in, w, row_bytes, r0, r1, bias, out, n_out);
    case 2: return dense_span<kType, 2>(x, in, w, row_bytes, r0, r1, bias, out, n_out);
    case 3: return dense_span<kType, 3>(x, in, w, row_bytes, r0, r1, bias, out, n_out);
    case 4: return dense_span<kType, 4>(x, in, w, row_bytes, r0, r1, bias, out, n_out);
  }
}

// Codes a step takes at once: 8 bytes of the row either way.
template <int kBits>
constexpr int64_t kCodesPerStep = kBits == 4 ? 16 : 8;

// The codes i..i + kCodesPerStep - 1 of a row as f32, 8 a vector. MLX packs a
// 4-bit code k of a word at bits 4k, so byte b holds codes 2b (low nibble) and
// 2b + 1 (high): the 8 bytes widened to lanes give the even codes masked and the
// odd ones shifted, matched by x deinterleaved the same way (deinterleave_x).
template <int kBits>
void codes(const uint32_t* row, int64_t i, __m256 (&q)[kCodesPerStep<kBits> / 8]) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(row) + uint64_t(i) * kBits / 8;
  const __m256i lanes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
  if constexpr (kBits == 4) {
    q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(lanes, _mm256_set1_epi32(0xf)));
    q[1] = _mm256_cvtepi32_ps(_mm256_srli_epi32(lanes, 4));
  } else {
    q[0] = _mm256_cvtepi32_ps(lanes);
  }
}

// x [T, in] with each 16 values as their 8 even ones then their 8 odd ones, the
// order codes<4> gives a step's codes in.
std::vector<float> deinterleave_x(const float* x, int64_t T, int64_t in) {
  std::vector<float> out(size_t(T * in));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < in; c += 16)
      for (int64_t l = 0; l < 8; ++l) {
        out[size_t(t * in + c + l)] = x[t * in + c + 2 * l];
        out[size_t(t * in + c + 8 + l)] = x[t * in + c + 2 * l + 1];
      }
  return out;
}

struct AffineRows {
  const uint32_t* packed;  // the weight's codes, `words` per row
  int64_t words, in, group, groups;
  int64_t first_row;    // the row whose scales and biases the two below start with
  const float* scales;  // as f32, `groups` per row
  const float* biases;
  const float* x_sums;  // [T, groups]
};

// kRows rows [r, r + kRows) of an affine weight times T tokens. Each group's
// sum(q * x) gathers in its own lanes, then scaled into the row's lanes.
template <int kBits, int T, int kRows>
void affine_rows(const AffineRows& a, const float* x, int64_t r, const float* bias, float* out, int64_t n_out) {
  __m256 acc[kRows][T];
  zero(acc);
  constexpr int kVectors = kCodesPerStep<kBits> / 8;
  for (int64_t j = 0; j < a.groups; ++j) {
    // A sum per vector of a step, so a step's multiply-adds do not wait on each other.
    __m256 group_acc[kVectors][kRows][T];
    #pragma GCC unroll 2
    for (auto& sums : group_acc) zero(sums);
    // The hardware prefetcher, tracking kRows short streams a page at most, falls
    // behind (int8 read at half the bandwidth): ask for the next kRows rows' group
    // now, a block ahead. (A prefetch past the weight's end is dropped, never a fault.)
    #pragma GCC unroll 8
    for (int k = 0; k < kRows; ++k)
      _mm_prefetch(reinterpret_cast<const char*>(a.packed + (r + k + kRows) * a.words) + j * a.group * kBits / 8,
                   _MM_HINT_T0);
    for (int64_t i = j * a.group; i < (j + 1) * a.group; i += kCodesPerStep<kBits>) {
      #pragma GCC unroll 8
      for (int k = 0; k < kRows; ++k) {
        __m256 q[kVectors];
        codes<kBits>(a.packed + (r + k) * a.words, i, q);
        #pragma GCC unroll 8
        for (int t = 0; t < T; ++t)
          #pragma GCC unroll 2
          for (int v = 0; v < kVectors; ++v)
            group_acc[v][k][t] = _mm256_fmadd_ps(q[v], _mm256_loadu_ps(x + t * a.in + i + 8 * v), group_acc[v][k][t]);
      }
    }
    #pragma GCC unroll 8
    for (int k = 0; k < kRows; ++k) {
      const __m256 scale = _mm256_set1_ps(a.scales[(r + k - a.first_row) * a.groups + j]);
      #pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m256 sum =
            kVectors == 1 ? group_acc[0][k][t] : _mm256_add_ps(group_acc[0][k][t], group_acc[kVectors - 1][k][t]);
        acc[k][t] = _mm256_fmadd_ps(scale, sum, acc[k][t]);
      }
    }
  }
  #pragma GCC unroll 8
  for (int k = 0; k < kRows; ++k)
    #pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const float* z = a.biases + (r + k - a.first_row) * a.groups;
      const float* xs = a.x_sums + t * a.groups;
      // dot's 8-lane sums, not one chain of scalar adds a row.
      const float y = horizontal_sum(acc[k][t]) + dot(z, xs, a.groups);
      out[t * n_out + r + k] = bias ? y + bias[r + k] : y;
    }
}

// kRows * T stays at 4 or fewer, as each row and token holds two sums (three for 4-bit codes).
template <int kBits, int T>
void affine_span(const AffineRows& a, const float* x, int64_t r0, int64_t r1, const float* bias, float* out,
                 int64_t n_out) {
  constexpr int kRows = T == 1 ? 4 : T == 2 ? 2 : 1;
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) affine_rows<kBits, T, kRows>(a, x, r, bias, out, n_out);
  for (; r < r1; ++r) affine_rows<kBits, T, 1>(a, x, r, bias, out, n_out);
}

template <int kBits>
void affine_span(int64_t T, const AffineRows& a, const float* x, int64_t r0, int64_t r1, const float* bias,
                 float* out, int64_t n_out) {
  switch (T) {
    case 1: return affine_span<kBits, 1>(a, x, r0, r1, bias, out, n_out);
    case 2: return affine_span<kBits, 2>(a, x, r0, r1, bias, out, n_out);
    case 3: return affine_span<kBits, 3>(a, x, r0, r1, bias, out, n_out);
    case 4: return affine_span<kBits, 4>(a, x, r0, r1, bias, out, n_out);
  }
}

struct Fp8Rows {
  const uint8_t* values;  // E4M3, `in` per row
  int64_t in, block;
  const float* scale_inv;  // [rows / block, scale_cols]
  int64_t scale_cols;
};

// kRows rows [r, r + kRows) of an FP8 weight times T tokens: each 128-column
// block's sum(w x) gathers in its own lanes (two sums, one per 8 of a step's 16
// values), then its block scale multiplies it into the row's lanes.
template <int T, int kRows>
void fp8_rows(const Fp8Rows& a, const float* x, int64_t r, const float* bias, float* out, int64_t n_out) {
  __m256 acc[kRows][T];
  zero(acc);
  for (int64_t c0 = 0; c0 < a.in; c0 += a.block) {
    __m256 block_acc[2][kRows][T];
    zero(block_acc[0]);
    zero(block_acc[1]);
    #pragma GCC unroll 8
    for (int k = 0; k < kRows; ++k)  // the next rows' block, as with the codes in affine_rows
      _mm_prefetch(reinterpret_cast<const char*>(a.values + (r + k + kRows) * a.in + c0), _MM_HINT_T0);
    for (int64_t i = c0; i < std::min(a.in, c0 + a.block); i += 16) {
      #pragma GCC unroll 8
      for (int k = 0; k < kRows; ++k) {
        __m256 low, high;
        e4m3x16_times_2_pow_minus_8(a.values + (r + k) * a.in + i, low, high);
        #pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          block_acc[0][k][t] = _mm256_fmadd_ps(low, _mm256_loadu_ps(x + t * a.in + i), block_acc[0][k][t]);
          block_acc[1][k][t] = _mm256_fmadd_ps(high, _mm256_loadu_ps(x + t * a.in + i + 8), block_acc[1][k][t]);
        }
      }
    }
    #pragma GCC unroll 8
    for (int k = 0; k < kRows; ++k) {
      // The decode's 2^-8 back in the scale (a power of two: exact).
      const __m256 scale = _mm256_set1_ps(a.scale_inv[(r + k) / a.block * a.scale_cols + c0 / a.block] * 256.0f);
      #pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        acc[k][t] = _mm256_fmadd_ps(scale, _mm256_add_ps(block_acc[0][k][t], block_acc[1][k][t]), acc[k][t]);
    }
  }
  #pragma GCC unroll 8
  for (int k = 0; k < kRows; ++k)
    #pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const float y = horizontal_sum(acc[k][t]);
      out[t * n_out + r + k] = bias ? y + bias[r + k] : y;
    }
}

// kRows * T stays at 4 or fewer: each row and token holds three sums.
template <int T>
void fp8_span(const Fp8Rows& a, const float* x, int64_t r0, int64_t r1, const float* bias, float* out, int64_t n_out) {
  constexpr int kRows = T == 1 ? 4 : T == 2 ? 2 : 1;
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) fp8_rows<T, kRows>(a, x, r, bias, out, n_out);
  for (; r < r1; ++r) fp8_rows<T, 1>(a, x, r, bias, out, n_out);
}

void fp8_span(int64_t T, const Fp8Rows& a, const float* x, int64_t r0, int64_t r1, const float* bias, float* out,
              int64_t n_out) {
  switch (T) {
    case 1: return fp8_span<1>(a, x, r0, r1, bias, out, n_out);
    case 2: return fp8_span<2>(a, x, r0, r1, bias, out, n_out);
    case 3: return fp8_span<3>(a, x, r0, r1, bias, out, n_out);
    case 4: return fp8_span<4>(a, x, r0, r1, bias, out, n_out);
  }
}

}  // namespace

bool direct_matvec(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  const int64_t T = x.dim(0), in = x.dim(1), n_out = w.dim(0);
  if (!g_direct_matvec || T > kMaxTokens) return false;
  const std::vector<float> b = to_f32(bias);
  const float* bias_f32 = b.empty() ? nullptr : b.data();
  const auto* weights = static_cast<const uint8_t*>(w.raw());
  const size_t row_bytes = size_t(in) * dtype_size(w.dtype());
  const float* xp = x.data<float>();
  float* yp = out.data<float>();
  using Span = void (*)(int64_t, const float*, int64_t, const uint8_t*, size_t, int64_t, int64_t, const float*, float*,
                        int64_t);
  const Span span = w.dtype() == DType::f32   ? Span(dense_span<DType::f32>)
                    : w.dtype() == DType::f16 ? Span(dense_span<DType::f16>)
                                              : Span(dense_span<DType::bf16>);
  parallel_for((n_out + kRowsPerChunk - 1) / kRowsPerChunk, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t r0 = c0 * kRowsPerChunk; r0 < std::min(n_out, c1 * kRowsPerChunk); r0 += kRowsPerChunk)
      for (int64_t t0 = 0; t0 < T; t0 += kTokensPerPass) {
        const int64_t r1 = std::min(n_out, r0 + kRowsPerChunk), tokens = std::min(kTokensPerPass, T - t0);
        const float* xt = xp + t0 * in;
        float* yt = yp + t0 * n_out;
        span(tokens, xt, in, weights, row_bytes, r0, r1, bias_f32, yt, n_out);
      }
  });
  ++g_direct_matvec_runs;
  return true;
}

bool direct_affine_matvec(const Tensor& x, const AffineWeight& w, const Tensor& bias, Tensor& out) {
  const int64_t T = x.dim(0), in = x.dim(1), n_out = w.packed.dim(0);
  // Groups of whole steps (8 bytes of codes), so a step never straddles two groups.
  const int64_t step = w.bits == 4 ? kCodesPerStep<4> : kCodesPerStep<8>;
  if (!g_direct_matvec || T > kMaxTokens || w.group_size % step != 0) return false;
  const int64_t groups = in / w.group_size;
  const std::vector<float> b = to_f32(bias);
  const float* bias_f32 = b.empty() ? nullptr : b.data();
  const std::vector<float> x_sums = group_sums(x, w.group_size);  // [T, groups]
  const std::vector<float> x_deinterleaved =
      w.bits == 4 ? deinterleave_x(x.data<float>(), T, in) : std::vector<float>();
  const float* xp = w.bits == 4 ? x_deinterleaved.data() : x.data<float>();
  parallel_for((n_out + kRowsPerChunk - 1) / kRowsPerChunk, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> scales(size_t(kRowsPerChunk * groups)), biases(scales.size());
    for (int64_t r0 = c0 * kRowsPerChunk; r0 < std::min(n_out, c1 * kRowsPerChunk); r0 += kRowsPerChunk) {
      const int64_t r1 = std::min(n_out, r0 + kRowsPerChunk);
      load_f32(w.scales, r0 * groups, (r1 - r0) * groups, scales.data());
      load_f32(w.biases, r0 * groups, (r1 - r0) * groups, biases.data());
      for (int64_t t0 = 0; t0 < T; t0 += kTokensPerPass) {
        const int64_t tokens = std::min(kTokensPerPass, T - t0);
        const AffineRows a{w.packed.data<uint32_t>(), w.packed.dim(1), in, w.group_size, groups, r0,
                           scales.data(), biases.data(), x_sums.data() + t0 * groups};
        const float* xt = xp + t0 * in;
        float* yt = out.data<float>() + t0 * n_out;
        if (w.bits == 4)
          affine_span<4>(tokens, a, xt, r0, r1, bias_f32, yt, n_out);
        else
          affine_span<8>(tokens, a, xt, r0, r1, bias_f32, yt, n_out);
      }
    }
  });
  ++g_direct_matvec_runs;
  return true;
}

bool direct_fp8_matvec(const Tensor& x, const Fp8Weight& w, const Tensor& bias, Tensor& out) {
  const int64_t T = x.dim(0), in = x.dim(1), n_out = w.values.dim(0);
  if (!g_direct_matvec || T > kMaxTokens || in % 16 != 0 || w.block % 16 != 0) return false;
  const std::vector<float> b = to_f32(bias);
  const float* bias_f32 = b.empty() ? nullptr : b.data();
  const Fp8Rows a{w.values.data<uint8_t>(), in, w.block, w.scale_inv.data<float>(), w.scale_inv.dim(1)};
  parallel_for((n_out + kRowsPerChunk - 1) / kRowsPerChunk, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t r0 = c0 * kRowsPerChunk; r0 < std::min(n_out, c1 * kRowsPerChunk); r0 += kRowsPerChunk)
      for (int64_t t0 = 0; t0 < T; t0 += kTokensPerPass)
        fp8_span(std::min(kTokensPerPass, T - t0), a, x.data<float>() + t0 * in, r0,
                 std::min(n_out, r0 + kRowsPerChunk), bias_f32, out.data<float>() + t0 * n_out, n_out);
  });
  ++g_direct_matvec_runs;
  return true;
}

bool tiled_matmul_applies() { return g_tiled_matmul; }

int64_t tiled_block_rows(const TiledTokens& x, int64_t n_out) {
  int64_t rows = 16;
  if (x.packed.defined())
    while (rows < 64 && n_out / (rows * 2) >= 2 * thread_count()) rows *= 2;
  return rows;
}

bool tiled_rows_product(const TiledTokens& x, const float* rows, int64_t n_rows, const float* bias, float* out,
                        int64_t n_out) {
  if (!g_tiled_matmul) return false;
  ++g_tiled_blocks;
  const int64_t T = x.T, in = x.in;
  if (packed_rows_product(x, rows, n_rows, bias, out, n_out) ||
      avx512_rows_product(x.x, T, in, rows, n_rows, bias, out, n_out))
    return true;
  for (int64_t t0 = 0; t0 < T; t0 += kTokensPerPass)
    dense_span<DType::f32>(std::min(kTokensPerPass, T - t0), x.x + t0 * in, in, reinterpret_cast<const uint8_t*>(rows),
                           size_t(in) * sizeof(float), 0, n_rows, bias, out + t0 * n_out, n_out);
  return true;
}

#else  // no AVX2: the staged forms serve every call

bool direct_matvec(const Tensor&, const Tensor&, const Tensor&, Tensor&) { return false; }
bool direct_affine_matvec(const Tensor&, const AffineWeight&, const Tensor&, Tensor&) { return false; }
bool direct_fp8_matvec(const Tensor&, const Fp8Weight&, const Tensor&, Tensor&) { return false; }
bool tiled_matmul_applies() { return false; }
bool tiled_rows_product(const TiledTokens&, const float*, int64_t, const float*, float*, int64_t) { return false; }
int64_t tiled_block_rows(const TiledTokens&, int64_t) { return 16; }

#endif

}  // namespace mere::ops::cpu
