// Helpers the GPU tests share: seeded random tensors, copies to the GPU, and the
// relative error they report ("[ gpu ]" lines) and assert on.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "ops/ops.h"
#include "test_util.h"

namespace mere::test {

// offset + scale * u, u uniform in [-1, 1), from a counter-based hash of the seed (CPU).
inline Tensor random(Shape shape, DType dt, uint64_t seed, float scale = 1.0f, float offset = 0.0f) {
  Tensor t = Tensor::empty(std::move(shape), dt);
  ops::fill_random(t, seed, scale, offset);
  return t;
}

inline Tensor gpu(const Tensor& t) { return t.to_device(Device::cuda); }

// max |got - want| / max |want|, printed with the case unless `print` is false; a
// non-finite element of `got` is a failure and gives infinity.
inline float relative_error(const Tensor& got_device, const Tensor& want, const std::string& label,
                            bool print = true) {
  Tensor got = got_device.to_device(Device::cpu);
  EXPECT_EQ(got.shape(), want.shape()) << label;
  float max_ref = 1e-30f;
  for (int64_t i = 0; i < want.numel(); ++i) max_ref = std::max(max_ref, std::fabs(want.at(i)));
  for (int64_t i = 0; i < got.numel(); ++i)
    if (!std::isfinite(got.at(i))) {
      ADD_FAILURE() << label << ": element " << i << " is " << got.at(i);
      return std::numeric_limits<float>::infinity();
    }
  const float rel = max_abs_diff(got, want).diff / max_ref;
  if (print) std::printf("[ gpu      ] %-56s rel err %.2e\n", label.c_str(), rel);
  return rel;
}

}  // namespace mere::test
