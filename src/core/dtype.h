// Element types and the scalar conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace mere {

// f8_e4m3: OCP FP8 E4M3 ("e4m3fn": no infinities, one NaN pattern), storage only.
enum class DType : uint8_t { f32, f16, bf16, i32, u32, u8, f8_e4m3 };

// E4M3 bits to float.
float f8_e4m3_to_f32(uint8_t bits);
// Float to the nearest E4M3 value, ties to even, saturating at +-448 (the format
// has no infinities, as torch's float8_e4m3fn cast with saturation); NaN -> NaN.
uint8_t f32_to_f8_e4m3(float v);

size_t dtype_size(DType dt);
std::string_view dtype_name(DType dt);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t u;
  if (exponent == 0x1f) {
    u = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    u = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    u = sign;
  } else {  // subnormal: normalise the mantissa
    int shift = 0;
    while (!(mantissa & 0x400u)) { mantissa <<= 1; ++shift; }
    mantissa &= 0x3ffu;
    u = sign | (uint32_t(113 - shift) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f);

}  // namespace mere
