// Small AVX2 steps the CPU kernels share (decode_matvec.cpp, fp8.cpp, attention.cpp).
#pragma once

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>

#include <cstdint>

namespace mere::ops::cpu {

// The sum of v's 8 lanes.
inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// src[0..15] as f32, times 2^-8: an E4M3 byte shifted left by 7 within 16 bits,
// its sign moved to bit 15, is the f16 of its value times 2^-8, subnormals
// included (both formats' subnormal steps stay 2^8 apart), which F16C widens
// exactly. The NaN codes (0x7f, 0xff) become f16 NaNs. The caller's scale
// restores the 2^8.
inline void e4m3x16_times_2_pow_minus_8(const uint8_t* src, __m256& low, __m256& high) {
  // Sign-extended, the byte's sign fills bits 8-15: shifted by 7, bit 15 holds
  // it and bit 14, which must be 0, is masked off.
  const __m256i bytes = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  const __m256i low7 = _mm256_set1_epi16(0x7f);
  __m256i half = _mm256_and_si256(_mm256_slli_epi16(bytes, 7), _mm256_set1_epi16(int16_t(0xbf80)));
  half = _mm256_blendv_epi8(half, _mm256_set1_epi16(0x7e00), _mm256_cmpeq_epi16(_mm256_and_si256(bytes, low7), low7));
  low = _mm256_cvtph_ps(_mm256_castsi256_si128(half));
  high = _mm256_cvtph_ps(_mm256_extracti128_si256(half, 1));
}

}  // namespace mere::ops::cpu

#endif
