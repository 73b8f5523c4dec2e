#include <gtest/gtest.h>

#include <cmath>

#include "core/tensor.h"

namespace mere {

TEST(DType, HalfConversionsRoundTripAndRoundToNearestEven) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), f32_to_f16(1.0f));      // tie rounds to even
  EXPECT_EQ(f16_to_f32(f32_to_f16(1e6f)), INFINITY);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);     // tie rounds to even
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.0f)), -3.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(Tensor, ReshapeAndSliceShareStorage) {
  Tensor t = Tensor::from_floats({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor r = t.reshape({3, -1});
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  Tensor row = t.slice_rows(1, 2);
  EXPECT_EQ(row.at(0), 4.0f);
  row.data<float>()[0] = 9;
  EXPECT_EQ(t.at(3), 9.0f);
  EXPECT_THROW(t.reshape({4, 2}), Error);
  EXPECT_THROW(t.slice_rows(1, 3), Error);
}

TEST(Tensor, ConvertsBetweenFloatTypes) {
  Tensor t = Tensor::from_floats({1.5f, -2.25f, 1e-3f}, {3});
  Tensor b = t.to(DType::bf16), h = t.to(DType::f16);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(b.at(i), t.at(i), std::fabs(t.at(i)) / 128);
    EXPECT_NEAR(h.at(i), t.at(i), std::fabs(t.at(i)) / 1024);
  }
}

}  // namespace mere
