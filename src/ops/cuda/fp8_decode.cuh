// E4M3 bytes as floats (exact: every E4M3 value is an f16 value), for the FP8
// decode kernels (fp8_matvec.cu, moe.cu).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace mere::cuda {

__device__ __forceinline__ float f8_to_float(uint8_t bits) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, __NV_E4M3)));
}

// 4 E4M3 values (first in the lowest byte) as floats.
__device__ __forceinline__ void decode_word(uint32_t word, float (&w)[4]) {
  const float2 lo = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(word), __NV_E4M3)));
  const float2 hi = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(word >> 16), __NV_E4M3)));
  w[0] = lo.x;
  w[1] = lo.y;
  w[2] = hi.x;
  w[3] = hi.y;
}

// 16 E4M3 values (one 16-byte chunk) as floats.
__device__ __forceinline__ void decode_chunk(const uint4& chunk, float (&w)[16]) {
  const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float f[4];
    decode_word(words[j], f);
#pragma unroll
    for (int i = 0; i < 4; ++i) w[4 * j + i] = f[i];
  }
}

}  // namespace mere::cuda
