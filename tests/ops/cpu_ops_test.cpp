// The CPU reference ops pinned to hand-computed values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "ops/ops.h"
#include "test_util.h"

namespace mere {
namespace {

// What running fn throws as an Error, or "no error".
template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

TEST(CpuOps, RmsNormByHand) {
  Tensor x = Tensor::from_floats({3, 4}, {1, 2});
  Tensor w = Tensor::from_floats({1, 2}, {2}).to(DType::bf16);
  Tensor y = ops::rms_norm(x, w, 0.0f);
  float inv = 1.0f / std::sqrt(12.5f);  // mean(9, 16)
  EXPECT_FLOAT_EQ(y.at(0), 3 * inv);
  EXPECT_FLOAT_EQ(y.at(1), 8 * inv);
  EXPECT_THROW(ops::rms_norm(x, Tensor::from_floats({1, 2, 3}, {3}), 1e-6f), Error);
}

TEST(CpuOps, LinearWithBiasOverEveryWeightType) {
  Tensor x = Tensor::from_floats({1, 2, 3, -1, 0, 2}, {2, 3});
  Tensor w = Tensor::from_floats({1, 0, 0, 0.5f, 0.5f, 0.5f}, {2, 3});
  Tensor b = Tensor::from_floats({10, 20}, {2});
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    Tensor y = ops::linear(x, w.to(dt), b);
    EXPECT_EQ(y.shape(), (Shape{2, 2}));
    EXPECT_FLOAT_EQ(y.at(0), 11);
    EXPECT_FLOAT_EQ(y.at(1), 23);
    EXPECT_FLOAT_EQ(y.at(2), 9);
    EXPECT_FLOAT_EQ(y.at(3), 20.5f);
  }
  EXPECT_THROW(ops::linear(x, Tensor::from_floats({1, 2}, {1, 2})), Error);
}

TEST(CpuOps, LinearMatchesNaiveOnOddSizes) {
  const int64_t T = 3, in = 37, out = 53;  // not multiples of the row block
  std::vector<float> xv, wv;
  for (int64_t i = 0; i < T * in; ++i) xv.push_back(std::sin(float(i)));
  for (int64_t i = 0; i < out * in; ++i) wv.push_back(std::cos(float(i) * 0.37f));
  Tensor y = ops::linear(Tensor::from_floats(xv, {T, in}), Tensor::from_floats(wv, {out, in}));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double want = 0;
      for (int64_t i = 0; i < in; ++i) want += double(xv[size_t(t * in + i)]) * wv[size_t(o * in + i)];
      EXPECT_NEAR(y.at(t * out + o), want, 1e-4);
    }
}

TEST(CpuOps, SiluMulByHand) {
  Tensor g = Tensor::from_floats({0, 1}, {2});
  Tensor u = Tensor::from_floats({5, 2}, {2});
  Tensor y = ops::silu_mul(g, u);
  EXPECT_FLOAT_EQ(y.at(0), 0);
  EXPECT_NEAR(y.at(1), 2 / (1 + std::exp(-1.0f)), 1e-6);
}

TEST(CpuOps, RopeRotatesHalvesOrPairs) {
  ops::RopeTable table;
  table.inv_freq = {1.0f, 0.0f};  // dim 0 rotates by pos radians, dim 1 not at all
  Tensor x = Tensor::from_floats({1, 2, 3, 4}, {1, 1, 4});
  ops::rope(x, {1}, table);  // rotate-half pairs (0, 2) and (1, 3)
  EXPECT_NEAR(x.at(0), std::cos(1.0f) - 3 * std::sin(1.0f), 1e-6);
  EXPECT_NEAR(x.at(2), 3 * std::cos(1.0f) + std::sin(1.0f), 1e-6);
  EXPECT_FLOAT_EQ(x.at(1), 2);
  EXPECT_FLOAT_EQ(x.at(3), 4);
  table.interleaved = true;  // pairs (0, 1) and (2, 3)
  Tensor y = Tensor::from_floats({1, 2, 3, 4}, {1, 1, 4});
  ops::rope(y, {1}, table);
  EXPECT_NEAR(y.at(0), std::cos(1.0f) - 2 * std::sin(1.0f), 1e-6);
  EXPECT_NEAR(y.at(1), 2 * std::cos(1.0f) + std::sin(1.0f), 1e-6);
  EXPECT_FLOAT_EQ(y.at(2), 3);
}

TEST(CpuOps, CausalGqaAttentionByHand) {
  // One kv head shared by two query heads; two positions.
  Tensor k = Tensor::from_floats({1, 0, 0, 1}, {2, 1, 2});
  Tensor v = Tensor::from_floats({10, 0, 0, 10}, {2, 1, 2});
  Tensor q = Tensor::from_floats({1, 0, 0, 0, /*t1*/ 2, 0, 0, 0}, {2, 2, 2});
  Tensor o = ops::attention(q, k, v, 0, 1.0f);
  // t=0 sees only key 0: output v0 for both heads.
  EXPECT_FLOAT_EQ(o.at(0), 10);
  EXPECT_FLOAT_EQ(o.at(2), 10);
  // t=1, head 0: scores (2, 0) -> softmax (e^2, 1)/(e^2+1).
  float p0 = std::exp(2.0f) / (std::exp(2.0f) + 1);
  EXPECT_NEAR(o.at(4), 10 * p0, 1e-5);
  EXPECT_NEAR(o.at(5), 10 * (1 - p0), 1e-5);
  // t=1, head 1: q = 0, uniform over both keys.
  EXPECT_NEAR(o.at(6), 5, 1e-5);
  EXPECT_THROW(ops::attention(q, k.slice_rows(0, 1), v.slice_rows(0, 1), 0, 1.0f), Error);
}

// Split-K attention's unmerged partials exist on the GPU only: the CPU has none
// to leave (attention_unmerged declines, running nothing), and partials that do
// not fit their op are refused with its name.
TEST(CpuOps, UnmergedAttentionIsGpuOnlyAndChecked) {
  const Tensor k = Tensor::from_floats({1, 0, 0, 1}, {2, 1, 2}), v = Tensor::from_floats({1, 2, 3, 4}, {2, 1, 2});
  const Tensor q = Tensor::from_floats({1, 0, 0, 1}, {1, 2, 2});
  Tensor pos = Tensor::zeros({1}, DType::i32);
  pos.data<int32_t>()[0] = 1;
  ops::AttentionSplits splits;
  EXPECT_FALSE(ops::attention_unmerged(q, k, v, pos, 1.0f, {}, splits));
  EXPECT_FALSE(splits.out.defined());

  const ops::AttentionSplits partials{.max = Tensor::zeros({1, 2, 3}, DType::f32),
                                      .sum = Tensor::zeros({1, 2, 3}, DType::f32),
                                      .out = Tensor::zeros({1, 2, 3, 2}, DType::f32)};
  EXPECT_NE(error_message([&] { ops::merge_attention(partials); }).find("merge_attention"), std::string::npos);
  Tensor h = Tensor::zeros({1, 4}, DType::f32);
  const Weight too_wide(Tensor::zeros({4, 5}, DType::f32));  // 5 columns for 2 heads x 2
  EXPECT_NE(error_message([&] { ops::attention_linear_add(h, partials, too_wide); }).find("attention_linear_add"),
            std::string::npos);
  const ops::AttentionSplits mismatched{.max = Tensor::zeros({1, 2, 2}, DType::f32),
                                        .sum = Tensor::zeros({1, 2, 3}, DType::f32),
                                        .out = Tensor::zeros({1, 2, 3, 2}, DType::f32)};
  EXPECT_NE(error_message([&] { ops::merge_attention(mismatched); }).find("do not fit"), std::string::npos);
}

// A cache whose heads do not match k is an error that says which cache form,
// dense or quantized, before anything is written.
TEST(CpuOps, QkNormRopeStoreNamesACacheThatDoesNotFit) {
  ops::RopeTable table;
  table.inv_freq = {1.0f, 0.5f};
  Tensor q = Tensor::zeros({1, 2, 4}, DType::f32), k = Tensor::zeros({1, 1, 4}, DType::f32), v = k.clone();
  Tensor pos = Tensor::empty({1}, DType::i32);
  pos.data<int32_t>()[0] = 0;
  Tensor kc = Tensor::zeros({8, 2, 4}, DType::f32), vc = kc.clone();  // two heads for k's one
  const std::string dense = error_message([&] { ops::qk_norm_rope_store(q, k, v, {}, {}, 1e-6f, table, pos, kc, vc); });
  EXPECT_NE(dense.find("qk_norm_rope_store"), std::string::npos) << dense;
  EXPECT_NE(dense.find("cache [8, 2, 4] do not fit"), std::string::npos) << dense;
  ops::AffineRows kq = ops::quantize_kv_rows(Tensor::zeros({8, 2, 4}, DType::f32), 8), vq = kq;
  const std::string quantized =
      error_message([&] { ops::qk_norm_rope_store(q, k, v, {}, {}, 1e-6f, table, pos, kq, vq); });
  EXPECT_NE(quantized.find("quantized cache"), std::string::npos) << quantized;
}

TEST(CpuOps, EmbedChecksIds) {
  Tensor table = Tensor::from_floats({1, 2, 3, 4, 5, 6}, {3, 2}).to(DType::f16);
  Tensor e = ops::embed(table, {2, 0});
  EXPECT_FLOAT_EQ(e.at(0), 5);
  EXPECT_FLOAT_EQ(e.at(3), 2);
  EXPECT_THROW(ops::embed(table, {3}), Error);
}

}  // namespace
}  // namespace mere

namespace mere {
namespace {

TEST(CpuOps, FusedHelpersMatchTheirCompositions) {
  Tensor gu = Tensor::from_floats({1, -2, 3, 4, 0.5f, 6, -1, 2}, {2, 4});  // gate [1,-2 | 0.5,6], up [3,4 | -1,2]
  Tensor y = ops::silu_mul_halves(gu);
  Tensor g = Tensor::from_floats({1, -2, 0.5f, 6}, {2, 2}), u = Tensor::from_floats({3, 4, -1, 2}, {2, 2});
  EXPECT_EQ(test::max_abs_diff(y, ops::silu_mul(g, u)).diff, 0.0f);
  const Tensor down = Tensor::from_floats({1, 2, -1, 0.5f, 0, 3}, {3, 2});
  EXPECT_EQ(test::max_abs_diff(ops::swiglu_linear(gu, down), ops::linear(y, down)).diff, 0.0f);
  EXPECT_THROW(ops::swiglu_linear(gu, Tensor::from_floats({1, 2, 3}, {1, 3})), Error);  // 3 columns for halves of 2

  auto parts = ops::split_columns(gu, {1, 3});
  EXPECT_EQ(parts[1].shape(), (Shape{2, 3}));
  EXPECT_FLOAT_EQ(parts[1].at(3), 0.5f * 0 + 6);  // row 1, column 1 of the second block
  auto views = ops::split_columns(gu.slice_rows(1, 2), {2, 2});  // T = 1: views, no copy
  EXPECT_EQ(views[1].raw(), gu.data<float>() + 6);
  EXPECT_THROW(ops::split_columns(gu, {1, 2}), Error);

  Tensor stacked = ops::concat_rows({g, u.to(DType::f32)});
  EXPECT_EQ(stacked.shape(), (Shape{4, 2}));
  EXPECT_FLOAT_EQ(stacked.at(5), 4);
  EXPECT_THROW(ops::concat_rows({g, u.to(DType::bf16)}), Error);

  Tensor h1 = Tensor::from_floats({1, 2, 3, 4}, {2, 2}), h2 = h1.clone(), w = Tensor::from_floats({1, 2}, {2});
  Tensor fused = ops::add_rms_norm(h1, g, w, 1e-6f);
  ops::add_inplace(h2, g);
  EXPECT_EQ(test::max_abs_diff(h1, h2).diff, 0.0f);
  EXPECT_EQ(test::max_abs_diff(fused, ops::rms_norm(h2, w, 1e-6f)).diff, 0.0f);
}

// The position moves on and the step's tokens land in the ring row of the new
// position (wrapping around), no other row; bad tokens or no ring are errors.
TEST(CpuOps, AdvancePositionWritesTheTokensToTheRowOfTheirPosition) {
  constexpr int64_t kB = 3, kSlots = 4;
  Tensor pos = Tensor::empty({1}, DType::i32), tokens = Tensor::empty({kB}, DType::i32);
  pos.data<int32_t>()[0] = 6;
  std::vector<int32_t> ring(kSlots * kB, -1);
  for (int32_t step = 0; step < 6; ++step) {
    for (int32_t b = 0; b < kB; ++b) tokens.data<int32_t>()[b] = 100 * step + b;
    ops::advance_position(pos, 1, tokens, ring.data(), kSlots);
    const int32_t p = pos.data<int32_t>()[0];
    ASSERT_EQ(p, 7 + step);
    for (int32_t b = 0; b < kB; ++b) EXPECT_EQ(ring[(p % kSlots) * kB + b], 100 * step + b);
    if (step == 0) {  // rows 0-2 are not the new position's
      EXPECT_TRUE(std::all_of(ring.begin(), ring.begin() + 3 * kB, [](int32_t v) { return v == -1; }));
    }
  }
  EXPECT_THROW(ops::advance_position(pos, 1, Tensor::empty({kB}, DType::f32), ring.data(), kSlots), Error);
  EXPECT_THROW(ops::advance_position(pos, 1, tokens, nullptr, kSlots), Error);
}

// Random bytes for packed codes: the same for one seed, masked, and not degenerate.
TEST(CpuOps, FillRandomBytesIsSeededAndMasked) {
  Tensor a = Tensor::empty({1001}, DType::u8), b = Tensor::empty({1001}, DType::u8), c = Tensor::empty({1001}, DType::u8);
  ops::fill_random_bytes(a, 5, 0xbf);
  ops::fill_random_bytes(b, 5, 0xbf);
  ops::fill_random_bytes(c, 6, 0xbf);
  int differ = 0, distinct_low = 0;
  std::vector<bool> seen(256);
  for (int64_t i = 0; i < 1001; ++i) {
    const uint8_t x = a.data<uint8_t>()[i];
    EXPECT_EQ(x, b.data<uint8_t>()[i]);
    EXPECT_EQ(x & 0x40, 0);  // the mask clears bit 6
    differ += x != c.data<uint8_t>()[i];
    if (!seen[x]) seen[x] = true, ++distinct_low;
  }
  EXPECT_GT(differ, 900);
  EXPECT_GT(distinct_low, 100);
}

}  // namespace
}  // namespace mere
