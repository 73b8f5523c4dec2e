#include <bit>
#include <cstring>
#include <vector>

#ifdef __F16C__
#include <immintrin.h>
#endif

#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {

void load_f32(const Tensor& src, int64_t offset, int64_t n, float* dst) {
  switch (src.dtype()) {
    case DType::f32:
      std::memcpy(dst, src.data<float>() + offset, size_t(n) * 4);
      return;
    case DType::bf16: {  // the high half of an f32, in a loop the compiler vectorizes
      const uint16_t* p = src.data<uint16_t>() + offset;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(uint32_t(p[i]) << 16);
      return;
    }
    case DType::f16: {
      const uint16_t* p = src.data<uint16_t>() + offset;
      int64_t i = 0;
#ifdef __F16C__
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i))));
#endif
      for (; i < n; ++i) dst[i] = f16_to_f32(p[i]);
      return;
    }
    default:
      fail("load_f32: {} is not a float dtype", dtype_name(src.dtype()));
  }
}

void convert(const Tensor& src, Tensor& dst) {
  const int64_t n = src.numel();
  if (dst.dtype() == DType::f32) {
    load_f32(src, 0, n, dst.data<float>());
    return;
  }
  std::vector<float> tmp(static_cast<size_t>(n));
  load_f32(src, 0, n, tmp.data());
  uint16_t* out = dst.data<uint16_t>();
  for (int64_t i = 0; i < n; ++i)
    out[i] = dst.dtype() == DType::bf16 ? f32_to_bf16(tmp[size_t(i)]) : f32_to_f16(tmp[size_t(i)]);
}

std::vector<float> to_f32(const Tensor& t) {
  std::vector<float> out;
  if (t.defined()) {
    out.resize(size_t(t.numel()));
    load_f32(t, 0, t.numel(), out.data());
  }
  return out;
}

std::vector<float> group_sums(const Tensor& x, int64_t group) {
  const int64_t T = x.dim(0), in = x.dim(1), groups = in / group;
  std::vector<float> sums(size_t(T * groups));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < groups; ++j) {
      const float* xg = x.data<float>() + t * in + j * group;
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < group; ++i) s += xg[i];
      sums[size_t(t * groups + j)] = s;
    }
  return sums;
}

// Eight-lane partial sums let the compiler vectorise without reassociating globally.
float dot(const float* a, const float* b, int64_t n) {
  float acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace mere::ops::cpu
