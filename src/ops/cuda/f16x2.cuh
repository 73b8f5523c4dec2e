// Two floats in one f16x2 word and back, as the tensor-core attention kernels
// (attention_affine_mma.cu, attention_mma.cu) feed their f16 mma operands.
#pragma once

#include <cstdint>
#include <cstring>

#include <cuda_fp16.h>

namespace mere::cuda {

// (lo, hi) rounded to f16, lo in the low half, saturating at +-65504 rather
// than overflowing to infinity.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float2 unpack_f16x2(uint32_t r) {
  __half2 h;
  memcpy(&h, &r, 4);
  return __half22float2(h);
}

}  // namespace mere::cuda
