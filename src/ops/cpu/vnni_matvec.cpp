// Affine decode matvecs on the CPU's integer dot products (lever cpu_vnni_matvec):
// x [T <= 8, in] f32 against MLX int8/int4 codes, on AVX-512 VNNI's vpdpbusd
// (4 u8 x s8 products added into each of 16 s32 lanes, 64 an instruction).
//
// The f32 kernels (decode_matvec.cpp) spend a conversion and a multiply-add on
// every weight, and at 4 bits that, not memory, bounds them. Here the codes stay
// integers: per token and group, x is scaled by the power of two 2^k that puts
// its largest value in [2^21, 2^22), rounded to an integer (23 significant bits,
// as the GPU's tensor_core_affine_matvec does) and written as three s8 base-256
// digits. The codes times each digit sum exactly in s32; per group, in f32,
// scale * 2^-k * (C0 + 256 C1 + 65536 C2) + bias * sum(x), sum(x) of x itself.
// The only change from the f32 product is x's rounding, 2^-23 of its group's
// largest value per term.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MERE_CPU_VNNI_MATVEC 1
#endif

#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/quantized_ops.h"

namespace mere::ops::cpu {
namespace {

std::atomic<bool> g_vnni_matvec{false};
std::atomic<int64_t> g_vnni_runs{0};

}  // namespace

void set_vnni_matvec(bool on) { g_vnni_matvec = on; }
int64_t vnni_matvec_runs() { return g_vnni_runs; }

#ifdef MERE_CPU_VNNI_MATVEC

bool vnni_available() {
  static const bool available = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vnni");
  return available;
}

namespace {

// The kernels' instruction set: 512-bit vectors. (256-bit ones ran at half the
// rate: at groups of 64 a group's epilogue, four conversions and multiply-adds a
// row, took as long as its dot products; a 512-bit step serves two groups.)
#define MERE_VNNI_TARGET __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vnni")))

constexpr int64_t kMaxTokens = 8;
constexpr int64_t kTokensPerPass = 4;
constexpr int64_t kRowsPerChunk = 64;
constexpr int kDigits = 3;
// A step: 64 bytes of a row's codes, 128 int4 or 64 int8 codes.
constexpr int64_t codes_per_step(int bits) { return bits == 4 ? 128 : 64; }

// x's digits: for token t, digit d, `digits[(t * kDigits + d) * stride + i]`,
// stride = in rounded up to whole steps (a last step part-filled with codes
// reads zero digits past them); at 4 bits each 128 values as their 64 even ones
// then their 64 odd ones, the order a step's low and high nibbles come in.
// powers[t * groups + j] = 2^-k of the group.
struct XDigits {
  int64_t stride = 0;
  std::vector<int8_t> digits;
  std::vector<float> powers;
};

// False where x holds an infinity or a NaN (the f32 kernels keep those as they
// are) or a group so small that 2^k is no float (largest below 2^-105).
// Groups are of whole 16-value vectors (vnni_affine_matvec).
MERE_VNNI_TARGET bool make_digits(const float* x, int64_t T, int64_t in, int64_t group, int bits, XDigits& d) {
  const int64_t groups = in / group, step = codes_per_step(bits);
  d.stride = (in + step - 1) / step * step;
  d.digits.assign(size_t(T * kDigits * d.stride), 0);
  d.powers.assign(size_t(T * groups), 0.0f);
  const __m512i half = _mm512_set1_epi32(128), byte = _mm512_set1_epi32(255);
  // 16 digits as their 8 even ones, then their 8 odd ones (the int4 layout).
  const __m128i even_then_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < groups; ++j) {
      const float* xg = x + t * in + j * group;
      __m512 largest = _mm512_setzero_ps();
      __mmask16 unordered = 0;
      for (int64_t i = 0; i < group; i += 16) {
        const __m512 v = _mm512_loadu_ps(xg + i);
        largest = _mm512_max_ps(largest, _mm512_abs_ps(v));
        unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      }
      const float top = _mm512_reduce_max_ps(largest);
      if (unordered != 0 || !std::isfinite(top)) return false;
      int e = 0;
      std::frexp(top, &e);  // top in [2^(e-1), 2^e); e = 0 for 0
      const int k = 22 - e;
      if (top != 0 && k > 127) return false;
      d.powers[size_t(t * groups + j)] = top == 0 ? 0.0f : std::ldexp(1.0f, -k);
      const __m512 up = _mm512_set1_ps(top == 0 ? 0.0f : std::ldexp(1.0f, k));
      for (int64_t i = 0; i < group; i += 16) {
        // x 2^k is exact (a power of two); rounded to the nearest integer, |v| <= 2^22.
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + i), up));
        const int64_t c = j * group + i;  // the first of 16 codes
        for (int digit = 0; digit < kDigits; ++digit) {
          const __m512i low =
              digit == kDigits - 1 ? v : _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(v, half), byte), half);
          v = _mm512_srai_epi32(_mm512_sub_epi32(v, low), 8);
          int8_t* out = d.digits.data() + (t * kDigits + digit) * d.stride;
          const __m128i bytes = _mm512_cvtepi32_epi8(low);
          if (bits == 8) {
            _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), bytes);
          } else {
            const int64_t even = c / step * step + c % step / 2;
            const __m128i split = _mm_shuffle_epi8(bytes, even_then_odd);
            _mm_storel_epi64(reinterpret_cast<__m128i*>(out + even), split);
            _mm_storel_epi64(reinterpret_cast<__m128i*>(out + even + step / 2), _mm_unpackhi_epi64(split, split));
          }
        }
      }
    }
  return true;
}

// factors[r][j] = scales[r][j] * powers[j] for `rows` rows of `groups`.
void scale_rows(const float* __restrict scales, const float* __restrict powers, int64_t rows, int64_t groups,
                float* __restrict factors) {
  for (int64_t r = 0; r < rows; ++r)
#pragma omp simd
    for (int64_t j = 0; j < groups; ++j) factors[r * groups + j] = scales[r * groups + j] * powers[j];
}

struct AffineRows {
  const uint8_t* codes;  // the weight's codes, row_bytes per row
  int64_t row_bytes, in, group, groups;
  int64_t first_row;     // the row whose factors and biases the two below start with
  const float* factors;  // per token of the pass, row and group: scale * 2^-k, [T][rows][groups]
  int64_t factors_per_token;
  const float* biases;   // as f32, `groups` per row
  const float* x_sums;   // [T, groups], of x itself
  const int8_t* digits;  // XDigits of the pass's first token
  int64_t stride;        // and its stride
};

// kRows rows [r, r + kRows) of the weight times T tokens. A block: one group of
// whole steps, or one step of kGroupsPerStep groups, lane l of its sums
// belonging to group l * kGroupsPerStep / 16 (lane l holds codes 8l..8l+7 at 4
// bits, taking each nibble of 32 bytes, and 4l..4l+3 at 8 bits). A row's last
// step may hold fewer groups: x's digits past the row are zeros, so its empty
// lanes sum 0 whatever factors they read; its codes past the row load as zeros
// (masked), never read past the weight's end.
template <int kBits, int T, int kRows, int kGroupsPerStep>
MERE_VNNI_TARGET void vnni_rows(const AffineRows& a, int64_t r, const float* bias, float* out, int64_t n_out) {
  constexpr int64_t kStep = codes_per_step(kBits);
  const int64_t block = kGroupsPerStep > 1 ? kStep : a.group;
  const __m512i nibble = _mm512_set1_epi8(0xf);
  const __m512i lane_group = _mm512_srli_epi32(
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(kGroupsPerStep)),
      4);
  __m512 acc[kRows][T];
  #pragma GCC unroll 8
  for (int k = 0; k < kRows; ++k)
    #pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[k][t] = _mm512_setzero_ps();
  // j: the block's first group.
  for (int64_t b0 = 0, j = 0; b0 < a.in; b0 += block, j += kGroupsPerStep) {
    __m512i sums[kDigits][kRows][T];
    #pragma GCC unroll 8
    for (int d = 0; d < kDigits; ++d)
      #pragma GCC unroll 8
      for (int k = 0; k < kRows; ++k)
        #pragma GCC unroll 8
        for (int t = 0; t < T; ++t) sums[d][k][t] = _mm512_setzero_si512();
    // The hardware prefetcher falls behind on kRows short streams (decode_matvec.cpp):
    // ask for the next kRows rows' block now.
    #pragma GCC unroll 8
    for (int k = 0; k < kRows; ++k)
      _mm_prefetch(reinterpret_cast<const char*>(a.codes + (r + k + kRows) * a.row_bytes + b0 * kBits / 8),
                   _MM_HINT_T0);
    for (int64_t i = b0; i < b0 + block; i += kStep) {
      #pragma GCC unroll 8
      for (int k = 0; k < kRows; ++k) {
        const uint8_t* codes = a.codes + (r + k) * a.row_bytes + i * kBits / 8;
        const __m512i w = i + kStep <= a.in ? _mm512_loadu_si512(codes)
                                            : _mm512_maskz_loadu_epi8(~0ull >> (64 - (a.in - i) * kBits / 8), codes);
        #pragma GCC unroll 8
        for (int t = 0; t < T; ++t)
          #pragma GCC unroll 3
          for (int d = 0; d < kDigits; ++d) {
            const int8_t* x = a.digits + (t * kDigits + d) * a.stride + i;
            if constexpr (kBits == 4) {
              sums[d][k][t] = _mm512_dpbusd_epi32(sums[d][k][t], _mm512_and_si512(w, nibble), _mm512_loadu_si512(x));
              sums[d][k][t] = _mm512_dpbusd_epi32(sums[d][k][t], _mm512_and_si512(_mm512_srli_epi16(w, 4), nibble),
                                                  _mm512_loadu_si512(x + kStep / 2));
            } else {
              sums[d][k][t] = _mm512_dpbusd_epi32(sums[d][k][t], w, _mm512_loadu_si512(x));
            }
          }
      }
    }
    #pragma GCC unroll 8
    for (int k = 0; k < kRows; ++k)
      #pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        // C0 + 256 C1 stays well inside s32 for groups up to 1,024 (vnni_affine_matvec).
        const __m512i low = _mm512_add_epi32(sums[0][k][t], _mm512_slli_epi32(sums[1][k][t], 8));
        const __m512 sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[2][k][t]), _mm512_set1_ps(65536.0f),
                                           _mm512_cvtepi32_ps(low));
        const float* factor = a.factors + t * a.factors_per_token + (r + k - a.first_row) * a.groups + j;
        const __m512 factors = kGroupsPerStep == 1
                                   ? _mm512_set1_ps(*factor)
                                   : _mm512_permutexvar_ps(lane_group, _mm512_castps128_ps512(_mm_loadu_ps(factor)));
        acc[k][t] = _mm512_fmadd_ps(factors, sum, acc[k][t]);
      }
  }
  #pragma GCC unroll 8
  for (int k = 0; k < kRows; ++k)
    #pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      // The biases' term, bias * sum(x) per group, joins the lanes before their
      // one reduction (a separate dot product a row took a tenth of the matvec).
      const float* z = a.biases + (r + k - a.first_row) * a.groups;
      const float* xs = a.x_sums + t * a.groups;
      for (int64_t j = 0; j < a.groups; j += 16) {
        const __mmask16 live = a.groups - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (a.groups - j)) - 1);
        acc[k][t] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(live, z + j), _mm512_maskz_loadu_ps(live, xs + j), acc[k][t]);
      }
      const float y = _mm512_reduce_add_ps(acc[k][t]);
      out[t * n_out + r + k] = bias ? y + bias[r + k] : y;
    }
}

// kRows * T stays at 4 or fewer: 16 sums and the step's digits fit the registers.
template <int kBits, int T, int kGroupsPerStep>
MERE_VNNI_TARGET void vnni_span(const AffineRows& a, int64_t r0, int64_t r1, const float* bias, float* out,
                                int64_t n_out) {
  constexpr int kRows = T == 1 ? 4 : T == 2 ? 2 : 1;
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) vnni_rows<kBits, T, kRows, kGroupsPerStep>(a, r, bias, out, n_out);
  for (; r < r1; ++r) vnni_rows<kBits, T, 1, kGroupsPerStep>(a, r, bias, out, n_out);
}

template <int kBits, int kGroupsPerStep>
void vnni_span(int64_t T, const AffineRows& a, int64_t r0, int64_t r1, const float* bias, float* out,
               int64_t n_out) {
  switch (T) {
    case 1: return vnni_span<kBits, 1, kGroupsPerStep>(a, r0, r1, bias, out, n_out);
    case 2: return vnni_span<kBits, 2, kGroupsPerStep>(a, r0, r1, bias, out, n_out);
    case 3: return vnni_span<kBits, 3, kGroupsPerStep>(a, r0, r1, bias, out, n_out);
    case 4: return vnni_span<kBits, 4, kGroupsPerStep>(a, r0, r1, bias, out, n_out);
  }
}

template <int kBits>
void vnni_span(int64_t groups_per_step, int64_t T, const AffineRows& a, int64_t r0, int64_t r1, const float* bias,
               float* out, int64_t n_out) {
  switch (groups_per_step) {
    case 1: return vnni_span<kBits, 1>(T, a, r0, r1, bias, out, n_out);
    case 2: return vnni_span<kBits, 2>(T, a, r0, r1, bias, out, n_out);
    case 4: return vnni_span<kBits, 4>(T, a, r0, r1, bias, out, n_out);
  }
}

}  // namespace

bool vnni_affine_matvec(const Tensor& x, const AffineWeight& w, const Tensor& bias, Tensor& out) {
  const int64_t T = x.dim(0), in = x.dim(1), n_out = w.packed.dim(0);
  const int bits = w.bits;
  const int64_t group = w.group_size, step = codes_per_step(bits);
  // A step holds 1, 2 or 4 whole groups (a row's last step fewer), or a group
  // whole steps; groups of at most 1,024, so C0 + 256 C1 (< 2^30 there) stays
  // inside s32; groups of whole 16-value vectors for make_digits.
  const int64_t groups_per_step = group < step && step % group == 0 ? step / group : 1;
  if (!g_vnni_matvec || !vnni_available() || T > kMaxTokens || (bits != 4 && bits != 8) || group > 1024 ||
      group % 16 != 0 || in % group != 0 || groups_per_step > 4 || (groups_per_step == 1 && group % step != 0))
    return false;
  XDigits digits;
  if (!make_digits(x.data<float>(), T, in, group, bits, digits)) return false;
  const int64_t groups = in / group;
  const std::vector<float> b = to_f32(bias);
  const float* bias_f32 = b.empty() ? nullptr : b.data();
  const std::vector<float> x_sums = group_sums(x, group);  // [T, groups]
  const auto* codes = reinterpret_cast<const uint8_t*>(w.packed.data<uint32_t>());
  const int64_t row_bytes = w.packed.dim(1) * int64_t(sizeof(uint32_t));
  parallel_for((n_out + kRowsPerChunk - 1) / kRowsPerChunk, 1, [&](int64_t c0, int64_t c1) {
    const int64_t per_token = kRowsPerChunk * groups;
    // 4 floats past the end: a step's factors are read 4 at a time.
    float* scales = thread_scratch(0, size_t(per_token));
    float* biases = thread_scratch(1, size_t(per_token));
    float* factors = thread_scratch(2, size_t(kTokensPerPass * per_token + 4));
    const int64_t end = std::min(n_out, c1 * kRowsPerChunk), scale_bytes = int64_t(dtype_size(w.scales.dtype()));
    for (int64_t r0 = c0 * kRowsPerChunk; r0 < end; r0 += kRowsPerChunk) {
      const int64_t r1 = std::min(n_out, r0 + kRowsPerChunk), n = (r1 - r0) * groups;
      // The next chunk's scales and biases on their way while this one's codes stream.
      if (r1 < end)
        for (int64_t byte = 0; byte < std::min(end - r1, kRowsPerChunk) * groups * scale_bytes; byte += 64) {
          _mm_prefetch(static_cast<const char*>(w.scales.raw()) + r1 * groups * scale_bytes + byte, _MM_HINT_T0);
          _mm_prefetch(static_cast<const char*>(w.biases.raw()) + r1 * groups * scale_bytes + byte, _MM_HINT_T0);
        }
      load_f32(w.scales, r0 * groups, n, scales);
      load_f32(w.biases, r0 * groups, n, biases);
      for (int64_t t0 = 0; t0 < T; t0 += kTokensPerPass) {
        const int64_t tokens = std::min(kTokensPerPass, T - t0);
        for (int64_t t = 0; t < tokens; ++t)
          scale_rows(scales, digits.powers.data() + (t0 + t) * groups, n / groups, groups,
                     factors + t * per_token);
        const AffineRows a{codes,
                           row_bytes,
                           in,
                           group,
                           groups,
                           r0,
                           factors,
                           per_token,
                           biases,
                           x_sums.data() + t0 * groups,
                           digits.digits.data() + t0 * kDigits * digits.stride,
                           digits.stride};
        float* yt = out.data<float>() + t0 * n_out;
        if (bits == 4)
          vnni_span<4>(groups_per_step, tokens, a, r0, r1, bias_f32, yt, n_out);
        else
          vnni_span<8>(groups_per_step, tokens, a, r0, r1, bias_f32, yt, n_out);
      }
    }
  });
  ++g_vnni_runs;
  return true;
}

#else

bool vnni_available() { return false; }
bool vnni_affine_matvec(const Tensor&, const AffineWeight&, const Tensor&, Tensor&) { return false; }

#endif

}  // namespace mere::ops::cpu
