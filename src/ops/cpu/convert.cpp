#include <cstring>

#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {

void load_f32(const Tensor& src, int64_t offset, int64_t n, float* dst) {
  switch (src.dtype()) {
    case DType::f32:
      std::memcpy(dst, src.data<float>() + offset, size_t(n) * 4);
      return;
    case DType::bf16: {
      const uint16_t* p = src.data<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::f16: {
      const uint16_t* p = src.data<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(p[i]);
      return;
    }
    default:
      fail("load_f32: {} is not a float dtype", dtype_name(src.dtype()));
  }
}

// Eight-lane partial sums let the compiler vectorise without reassociating globally.
float dot(const float* a, const float* b, int64_t n) {
  float acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace mere::ops::cpu
