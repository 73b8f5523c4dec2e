#include "core/dtype.h"

#include <cmath>

namespace mere {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::f32: case DType::i32: case DType::u32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::u8: case DType::f8_e4m3: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dt) {
  switch (dt) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::u32: return "u32";
    case DType::u8: return "u8";
    case DType::f8_e4m3: return "f8_e4m3";
  }
  return "?";
}

float f8_e4m3_to_f32(uint8_t bits) {
  const int exponent = (bits >> 3) & 0xf, mantissa = bits & 0x7;
  float v;
  if (exponent == 0xf && mantissa == 0x7) v = __builtin_nanf("");  // the one NaN; no infinities
  else if (exponent == 0) v = float(mantissa) * 0x1p-9f;           // subnormal: m / 8 * 2^-6
  else {
    uint32_t u = (uint32_t(exponent + 120) << 23) | (uint32_t(mantissa) << 20);  // rebias 7 -> 127
    std::memcpy(&v, &u, 4);
  }
  return (bits & 0x80) ? -v : v;
}

uint8_t f32_to_f8_e4m3(float v) {
  if (std::isnan(v)) return 0x7f;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const float a = std::fabs(v);
  if (a >= 448.0f) return sign | 0x7e;  // the largest finite value
  // The codes 0..0x7e are the non-negative values in increasing order: the last
  // one not above a, then the nearer of it and the next (ties: the even code).
  int lo = 0, hi = 0x7e;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (f8_e4m3_to_f32(uint8_t(mid)) <= a) lo = mid;
    else hi = mid - 1;
  }
  if (lo < 0x7e) {
    const float below = f8_e4m3_to_f32(uint8_t(lo)), above = f8_e4m3_to_f32(uint8_t(lo + 1));
    if (a - below > above - a || (a - below == above - a && lo % 2 == 1)) ++lo;
  }
  return sign | uint8_t(lo);
}

// Round to nearest even, with subnormals and overflow to infinity.
uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: infinity
  if (abs < 0x38800000u) {                       // below the smallest normal half
    if (abs < 0x33000000u) return sign;          // rounds to zero
    uint32_t exponent = abs >> 23;
    uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exponent;             // 14 + (112 - exponent) + 1 - 1
    uint32_t half = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1);
    uint32_t midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1u))) ++half;
    return sign | uint16_t(half);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | uint16_t(((rounded >> 13) - (112u << 10)) & 0xffffu);
}

}  // namespace mere
