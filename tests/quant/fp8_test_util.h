// Random FP8 weights for the CPU and GPU FP8 tests.
#pragma once

#include <cmath>
#include <random>

#include "ops/weight.h"

namespace mere::test {

// Random E4M3 bytes (never the NaN patterns 0x7f / 0xff) and scales in [1e-2, 1].
inline Fp8Weight random_fp8(int64_t out, int64_t in, int block, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensor values = Tensor::empty({out, in}, DType::f8_e4m3);
  for (int64_t i = 0; i < values.numel(); ++i) {
    uint8_t b;
    do b = uint8_t(rng()); while ((b & 0x7f) == 0x7f);
    values.data<uint8_t>()[i] = b;
  }
  Tensor scales = Tensor::empty({(out + block - 1) / block, (in + block - 1) / block}, DType::f32);
  std::uniform_real_distribution<float> log_scale(std::log(1e-2f), 0.0f);
  for (int64_t i = 0; i < scales.numel(); ++i) scales.data<float>()[i] = std::exp(log_scale(rng));
  return {values, scales, block};
}

}  // namespace mere::test
