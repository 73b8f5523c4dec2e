// MLX affine quantization: the quantizer (quant/affine_quantize.h) pinned to
// hand-computed groups and words, its round trip through Weight::dequantize, and
// the fused CPU kernel (ops/cpu/affine.cpp) against dequantize + the dense matmul.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ops/ops.h"
#include "quant/affine_quantize.h"
#include "test_util.h"

namespace mere {
namespace {

Tensor random_weight(int64_t rows, int64_t cols, uint32_t seed, DType dtype) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> v(size_t(rows * cols));
  for (float& x : v) x = normal(rng);
  // Groups that stress the edge rule: all zero, constant, all negative, all positive.
  if (rows >= 4 && cols >= 32) {
    for (int i = 0; i < 32; ++i) {
      v[size_t(0 * cols + i)] = 0.0f;
      v[size_t(1 * cols + i)] = 0.25f;
      v[size_t(2 * cols + i)] = -std::fabs(v[size_t(2 * cols + i)]) - 0.01f;
      v[size_t(3 * cols + i)] = std::fabs(v[size_t(3 * cols + i)]) + 0.01f;
    }
  }
  Tensor t = Tensor::from_floats(v, {rows, cols});
  return dtype == DType::f32 ? t : t.to(dtype);
}

// Code i of a row, read with our own shifts: the first in the lowest bits.
uint32_t code(const AffineWeight& a, int64_t row, int64_t i) {
  const int64_t per_word = 32 / a.bits, words = a.packed.dim(1);
  const uint32_t word = a.packed.data<uint32_t>()[row * words + i / per_word];
  return (word >> (a.bits * (i % per_word))) & ((1u << a.bits) - 1);
}

// Half a unit in the last place, relative, of a scale stored as `dt`.
float storage_epsilon(DType dt) { return dt == DType::bf16 ? 0x1p-8f : dt == DType::f16 ? 0x1p-11f : 0x1p-23f; }

TEST(AffineQuantize, HandComputedGroupsAndWords) {
  // 0, 1, ..., 6, 7.5 (x4): the max edge dominates, so the scale is negative:
  // scale = -7.5 / 15 = -0.5, bias = 7.5, codes (w - 7.5) / -0.5.
  std::vector<float> a;
  for (int r = 0; r < 4; ++r)
    for (float v : {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.5f}) a.push_back(v);
  // 0, -0.5, ..., -7.5 (x2): the min edge dominates: scale 0.5, bias -7.5, codes 15 - k.
  std::vector<float> b;
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 16; ++k) b.push_back(-0.5f * float(k));
  std::vector<float> both = a;
  both.insert(both.end(), b.begin(), b.end());
  AffineWeight q = quantize_affine(Tensor::from_floats(both, {2, 32}), 4, 32, DType::f32);
  ASSERT_EQ(q.packed.shape(), (Shape{2, 4}));
  ASSERT_EQ(q.scales.shape(), (Shape{2, 1}));
  EXPECT_EQ(q.scales.at(0), -0.5f);
  EXPECT_EQ(q.biases.at(0), 7.5f);
  EXPECT_EQ(q.scales.at(1), 0.5f);
  EXPECT_EQ(q.biases.at(1), -7.5f);
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(q.packed.data<uint32_t>()[w], 0x0357'9BDFu) << w;      // codes 15 13 11 9 7 5 3 0
    EXPECT_EQ(q.packed.data<uint32_t>()[4 + w], w % 2 ? 0x0123'4567u : 0x89AB'CDEFu) << w;
  }

  // 8 bits, w = 0 .. 31: scale = 31 / -255, bias 31, codes round((31 - i) * 255 / 31).
  std::vector<float> ramp;
  for (int i = 0; i < 32; ++i) ramp.push_back(float(i));
  AffineWeight r = quantize_affine(Tensor::from_floats(ramp, {1, 32}), 8, 32, DType::f32);
  ASSERT_EQ(r.packed.shape(), (Shape{1, 8}));
  EXPECT_FLOAT_EQ(r.scales.at(0), -31.0f / 255.0f);
  EXPECT_EQ(r.biases.at(0), 31.0f);
  EXPECT_EQ(r.packed.data<uint32_t>()[0], 0xE6EF'F7FFu);  // 255 247 239 230
  EXPECT_EQ(r.packed.data<uint32_t>()[7], 0x0008'1019u);  // 25 16 8 0
}

// MLX pins the group's larger edge and zero to exact codes (scale = edge / q0), which can
// shorten the span by up to one step at the far end: weights there, clipped to the
// top code, may be up to one step off. Every other weight is within half a step.
TEST(AffineQuantize, RoundTripIsTheAffineFormulaWithinHalfAStep) {
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (int bits : {4, 8})
      for (int g : {32, 64, 128}) {
        const int64_t rows = 24, cols = 256;
        Tensor dense = random_weight(rows, cols, uint32_t(bits * 1000 + g), dt);
        AffineWeight a = quantize_affine(dense, bits, g, dt);
        const std::string label = fmt::format("{} int{} g{}", dtype_name(dt), bits, g);
        ASSERT_EQ(a.packed.shape(), (Shape{rows, cols * bits / 32})) << label;
        ASSERT_EQ(a.scales.dtype(), dt) << label;
        ASSERT_EQ(a.biases.shape(), (Shape{rows, cols / g})) << label;
        Tensor deq = Weight(a, cols).dequantize(DType::f32);
        std::vector<float> w = dense.to_floats(), s = a.scales.to_floats(), b = a.biases.to_floats();
        const uint32_t top = (1u << bits) - 1;
        const float eps = storage_epsilon(dt);
        int64_t clipped_past_half = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < cols; ++i) {
            const size_t gi = size_t(r * (cols / g) + i / g);
            const uint32_t q = code(a, r, i);
            const float formula = s[gi] * float(q) + b[gi];
            const float got = deq.at(r * cols + i);
            ASSERT_NEAR(got, formula, 1e-6f * std::fabs(formula) + 1e-9f) << label << " at " << r << ", " << i;
            // Plus what rounding the scale and bias to their dtype moved the code's value.
            const float slack = std::fabs(s[gi]) * eps * float(top + 1) + std::fabs(b[gi]) * eps + 1e-7f;
            const float err = std::fabs(got - w[size_t(r * cols + i)]);
            const float steps = q == top ? 1.0f : 0.5f;
            ASSERT_LE(err, std::fabs(s[gi]) * steps + slack)
                << label << " at " << r << ", " << i << ": w " << w[size_t(r * cols + i)] << ", code " << q
                << ", scale " << s[gi] << ", bias " << b[gi];
            if (err > std::fabs(s[gi]) * 0.5f + slack) ++clipped_past_half;
          }
        // Groups of 32 zeros, or of one constant, come back exactly.
        for (int i = 0; g == 32 && i < 32; ++i) {
          EXPECT_EQ(deq.at(i), 0.0f) << label;
          EXPECT_EQ(deq.at(cols + i), 0.25f) << label;
        }
        EXPECT_LT(clipped_past_half, rows * cols / 100) << label;
      }
}

TEST(AffineQuantize, RefusesBadArguments) {
  Tensor w = random_weight(4, 96, 1, DType::bf16);
  EXPECT_THROW(quantize_affine(w, 3, 32, DType::bf16), Error);
  EXPECT_THROW(quantize_affine(w, 4, 48, DType::bf16), Error);
  EXPECT_THROW(quantize_affine(w, 4, 64, DType::bf16), Error);  // 96 columns: not groups of 64
  EXPECT_THROW(quantize_affine(Tensor::zeros({4, 32}, DType::i32), 4, 32, DType::bf16), Error);
}

TEST(AffineLinear, FusedKernelMatchesDequantizedMatmul) {
  const int64_t out = 37, in = 384;  // rows not a multiple of the kernel's block of 16
  int checked = 0;
  for (int bits : {4, 8})
    for (int g : {32, 64, 128})
      for (int64_t T : {1, 3, 17}) {
        AffineWeight a = quantize_affine(random_weight(out, in, uint32_t(bits + g), DType::bf16), bits, g, DType::bf16);
        Weight w(a, in);
        Tensor dense = w.dequantize(DType::f32);
        std::vector<float> xv(static_cast<size_t>(T * in)), bv(static_cast<size_t>(out));
        std::mt19937 rng(uint32_t(T * 7 + bits));
        std::normal_distribution<float> normal(0.3f, 1.0f);  // a mean, so bias * sum(x) matters
        for (float& x : xv) x = normal(rng);
        for (float& x : bv) x = normal(rng);
        Tensor x = Tensor::from_floats(xv, {T, in});
        for (bool with_bias : {false, true}) {
          Tensor bias = with_bias ? Tensor::from_floats(bv, {out}) : Tensor();
          Tensor got = ops::linear(x, w, bias), want = ops::linear(x, dense, bias);
          const float max_ref = test::max_abs(want);
          test::MaxDiff d = test::max_abs_diff(got, want);
          EXPECT_LE(d.diff, 1e-5f * max_ref) << "int" << bits << " g" << g << " T " << T << " bias " << with_bias
                                             << ": worst at " << d.index;
          ++checked;
        }
      }
  EXPECT_EQ(checked, 36);
}

TEST(AffineLinear, FusedKernelByHand) {
  // One row, one group of 32: codes 15 13 ... 0 (x4), scale -0.5, bias 7.5, so w is 0, 1, ..., 6, 7.5 (x4).
  std::vector<float> w;
  for (int r = 0; r < 4; ++r)
    for (float v : {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.5f}) w.push_back(v);
  Weight q(quantize_affine(Tensor::from_floats(w, {1, 32}), 4, 32, DType::bf16), 32);
  std::vector<float> x(32, 0.0f);
  x[1] = 2.0f;   // 2 * 1
  x[7] = -1.0f;  // -1 * 7.5
  x[30] = 0.5f;  // 0.5 * 6
  Tensor y = ops::linear(Tensor::from_floats(x, {1, 32}), q, Tensor::from_floats({100.0f}, {1}));
  EXPECT_FLOAT_EQ(y.at(0), 2.0f - 7.5f + 3.0f + 100.0f);
}

}  // namespace
}  // namespace mere
