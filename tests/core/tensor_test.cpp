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

TEST(Tensor, HostAllocationsAreCountedLiveAndAtPeak) {
  reset_host_tensor_bytes_peak();
  const uint64_t live0 = host_tensor_bytes_live();
  {
    Tensor a = Tensor::empty({1000}, DType::f32);  // 4000 bytes, rounded up to 4032 (64-byte lines)
    EXPECT_EQ(host_tensor_bytes_live(), live0 + 4032);
    {
      Tensor b = Tensor::empty({10}, DType::bf16);  // 20 -> 64
      EXPECT_EQ(host_tensor_bytes_live(), live0 + 4096);
    }
    Tensor view = a.slice_rows(0, 10);  // shares storage: no allocation
    EXPECT_EQ(host_tensor_bytes_live(), live0 + 4032);
  }
  EXPECT_EQ(host_tensor_bytes_live(), live0);
  EXPECT_EQ(host_tensor_bytes_peak(), live0 + 4096);
  reset_host_tensor_bytes_peak();
  EXPECT_EQ(host_tensor_bytes_peak(), live0);
}

}  // namespace mere
