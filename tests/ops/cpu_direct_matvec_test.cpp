// Lever cpu_direct_matvec (ops/cpu/decode_matvec.cpp): the CPU's 1-8-token
// matvecs on the stored weights in registers, against the staged forms
// (the weights written out as f32 first) and the dequantized matmul; and lever
// cpu_tiled_matmul: those staged forms' blocks multiplied in register tiles.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/levers.h"
#include "models/model.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"
#include "quant/affine_quantize.h"
#include "quant/fp8_test_util.h"
#include "test_util.h"

namespace mere {
namespace {

Tensor random_matrix(int64_t rows, int64_t cols, uint32_t seed, float mean, float sd) {
  return Tensor::from_floats(test::normal_values(rows * cols, seed, mean, sd), {rows, cols});
}

Tensor tiled_linear(bool tiled, const Tensor& x, const Weight& w, const Tensor& bias) {
  const test::CpuLever lever(ops::cpu::set_tiled_matmul, tiled);
  return ops::linear(x, w, bias);
}

Tensor linear_with(bool direct, const Tensor& x, const Weight& w, const Tensor& bias) {
  const test::CpuLever lever(ops::cpu::set_direct_matvec, direct);
  return ops::linear(x, w, bias);
}

// Within f32 reordering of the staged product: the sums run in another order.
// The affine form's two terms (scale * sum(q * x) and bias * sum(x)) cancel in
// part, so its rounding shows larger against the result (AffineLinear's bound).
void expect_close(const Tensor& got, const Tensor& want, const std::string& what, float relative = 2e-6f) {
  const float max_ref = test::max_abs(want);
  const test::MaxDiff d = test::max_abs_diff(got, want);
  EXPECT_LE(d.diff, relative * max_ref) << what << ": worst at " << d.index << " of " << want.numel();
}

TEST(CpuDirectMatvec, DenseMatchesTheStagedProduct) {
  // 37 rows: blocks of 4 and 2 rows and a rest; 100 columns: 12 runs of 8 and a tail of 4.
  const int64_t out = 37, in = 100;
  int checked = 0;
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (int64_t T : {1, 2, 3, 4, 7}) {
      const Tensor w = random_matrix(out, in, uint32_t(T), 0.0f, 0.05f).to(dt);
      const Tensor x = random_matrix(T, in, uint32_t(10 + T), 0.3f, 1.0f);
      const Tensor bias = random_matrix(1, out, 7, 0.0f, 1.0f).reshape({out});
      for (const Tensor& b : {Tensor(), bias}) {
        const int64_t runs = ops::cpu::direct_matvec_runs();
        const Tensor got = linear_with(true, x, w, b);
        EXPECT_EQ(ops::cpu::direct_matvec_runs(), runs + 1) << "the direct form did not run";
        expect_close(got, linear_with(false, x, w, b),
                     std::string(dtype_name(dt)) + " T " + std::to_string(T) + (b.defined() ? " bias" : ""));
        ++checked;
      }
    }
  EXPECT_EQ(checked, 30);
}

TEST(CpuDirectMatvec, AffineMatchesTheDequantizedProduct) {
  const int64_t out = 37, in = 384;
  int checked = 0;
  for (int bits : {4, 8})
    for (int g : {32, 64, 128})
      for (int64_t T : {1, 2, 3, 4, 8}) {
        const AffineWeight a = quantize_affine(random_matrix(out, in, uint32_t(bits * g), 0.0f, 0.05f).to(DType::bf16),
                                               bits, g, DType::bf16);
        const Weight w(a, in);
        const Tensor dense = w.dequantize(DType::f32);
        // A mean, so the biases' bias * sum(x) term matters.
        const Tensor x = random_matrix(T, in, uint32_t(T * 7 + bits), 0.3f, 1.0f);
        const Tensor bias = random_matrix(1, out, 9, 0.0f, 1.0f).reshape({out});
        for (const Tensor& b : {Tensor(), bias}) {
          const int64_t runs = ops::cpu::direct_matvec_runs();
          const Tensor got = linear_with(true, x, w, b);
          EXPECT_EQ(ops::cpu::direct_matvec_runs(), runs + 1) << "the direct form did not run";
          const std::string what =
              "int" + std::to_string(bits) + " g" + std::to_string(g) + " T " + std::to_string(T);
          expect_close(got, linear_with(false, x, dense, b), what + " against the dequantized product", 1e-5f);
          expect_close(got, linear_with(false, x, w, b), what + " against the staged fused kernel", 1e-5f);
          ++checked;
        }
      }
  EXPECT_EQ(checked, 60);
}

// FP8 rows: blocks of 128 and 64 columns, a last block of 16 (400 columns), 137
// rows (the scale rows change every 64 or 128, blocks of 4 rows and a rest),
// T 1-4 and 8; a NaN code gives NaN in its row alone.
TEST(CpuDirectMatvec, Fp8MatchesTheDequantizedProduct) {
  int checked = 0;
  for (int block : {128, 64})
    for (int64_t in : {256, 400})
      for (int64_t T : {1, 2, 3, 4, 8}) {
        const int64_t out = 137;
        const Weight w(test::random_fp8(out, in, block, uint64_t(block + in + T)));
        const Tensor x = random_matrix(T, in, uint32_t(T + in), 0.3f, 1.0f);
        const Tensor bias = random_matrix(1, out, 9, 0.0f, 1.0f).reshape({out});
        for (const Tensor& b : {Tensor(), bias}) {
          const int64_t runs = ops::cpu::direct_matvec_runs();
          const Tensor got = linear_with(true, x, w, b);
          EXPECT_EQ(ops::cpu::direct_matvec_runs(), runs + 1) << "the direct form did not run";
          const std::string what = "block " + std::to_string(block) + " in " + std::to_string(in) + " T " +
                                   std::to_string(T);
          expect_close(got, linear_with(false, x, w.dequantize(DType::f32), b), what + " against the dequantized",
                       1e-5f);
          ++checked;
        }
      }
  EXPECT_EQ(checked, 40);
  Fp8Weight with_nan = test::random_fp8(8, 256, 128, 5);
  with_nan.values.data<uint8_t>()[3 * 256 + 200] = 0xff;
  const Tensor y = linear_with(true, random_matrix(1, 256, 6, 0.0f, 1.0f), Weight(with_nan), Tensor());
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(std::isnan(y.at(r)), r == 3) << r;
}

TEST(CpuDirectMatvec, RunsOnlyWhereItApplies) {
  const Tensor w = random_matrix(16, 64, 1, 0.0f, 0.05f).to(DType::bf16);
  const Weight q(quantize_affine(w, 4, 32, DType::bf16), 64);
  const Tensor nine = random_matrix(9, 64, 2, 0.0f, 1.0f), one = random_matrix(1, 64, 3, 0.0f, 1.0f);
  const int64_t runs = ops::cpu::direct_matvec_runs();
  linear_with(true, nine, w, Tensor());  // 9 tokens: the staged form
  linear_with(true, nine, q, Tensor());
  linear_with(false, one, w, Tensor());  // the lever off
  linear_with(false, one, q, Tensor());
  // FP8 rows of 72 columns: not whole 16-value steps.
  linear_with(true, random_matrix(1, 72, 4, 0.0f, 1.0f), Weight(test::random_fp8(16, 72, 128, 1)), Tensor());
  EXPECT_EQ(ops::cpu::direct_matvec_runs(), runs);
  linear_with(true, one, w, Tensor());
  linear_with(true, one, q, Tensor());
  EXPECT_EQ(ops::cpu::direct_matvec_runs(), runs + 2);
}

// Prefill's staged blocks in register tiles: 9-40 tokens (passes of 4 and a
// rest), dense f32/f16/bf16 (a column tail) and affine int4/int8 dequantized
// per block, against the dot-per-row form and the dequantized product.
TEST(CpuTiledMatmul, MatchesTheStagedProduct) {
  const int64_t out = 37;
  int checked = 0;
  for (int64_t T : {9, 13, 40}) {
    const Tensor bias = random_matrix(1, out, 5, 0.0f, 1.0f).reshape({out});
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      const int64_t in = 100;
      const Tensor w = random_matrix(out, in, uint32_t(T), 0.0f, 0.05f).to(dt);
      const Tensor x = random_matrix(T, in, uint32_t(20 + T), 0.3f, 1.0f);
      const int64_t blocks = ops::cpu::tiled_matmul_blocks();
      const Tensor got = tiled_linear(true, x, w, bias);
      EXPECT_GT(ops::cpu::tiled_matmul_blocks(), blocks) << "the tiled product did not run";
      expect_close(got, tiled_linear(false, x, w, bias), std::string(dtype_name(dt)) + " T " + std::to_string(T));
      ++checked;
    }
    for (int bits : {4, 8})
      for (int g : {32, 64, 128}) {
        const int64_t in = 384;
        const Tensor w = random_matrix(out, in, uint32_t(bits + g), 0.0f, 0.05f).to(DType::bf16);
        const AffineWeight a = quantize_affine(w, bits, g, DType::bf16);
        const Weight q(a, in);
        const Tensor x = random_matrix(T, in, uint32_t(30 + T), 0.3f, 1.0f);
        const int64_t blocks = ops::cpu::tiled_matmul_blocks();
        const Tensor got = tiled_linear(true, x, q, bias);
        EXPECT_GT(ops::cpu::tiled_matmul_blocks(), blocks) << "the tiled product did not run";
        const std::string what = "int" + std::to_string(bits) + " g" + std::to_string(g) + " T " + std::to_string(T);
        expect_close(got, tiled_linear(false, x, q.dequantize(DType::f32), bias), what + " against the dequantized",
                     1e-5f);
        expect_close(got, tiled_linear(false, x, q, bias), what + " against the fused staged kernel", 1e-5f);
        ++checked;
      }
  }
  EXPECT_EQ(checked, 27);
  // Off, the staged form keeps its dot products.
  const int64_t blocks = ops::cpu::tiled_matmul_blocks();
  tiled_linear(false, random_matrix(9, 64, 1, 0.0f, 1.0f), random_matrix(16, 64, 2, 0.0f, 1.0f), Tensor());
  EXPECT_EQ(ops::cpu::tiled_matmul_blocks(), blocks);
}

// A CPU model sets both levers from its load options before it runs: with the
// defaults its prefill (12 tokens) takes the tiled product and its decode step
// the direct matvec; loaded with every lever off, neither.
TEST(CpuDirectMatvec, ACpuModelRunsWithItsLevers) {
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  for (const Levers& levers : {Levers{}, Levers::all_off()}) {
    const bool on = levers.cpu_direct_matvec;
    const std::unique_ptr<Model> model =
        load_model(test::model_dir("demo"), Device::cpu, levers.load_options(Device::cpu));
    auto state = model->make_state(32);
    const int64_t blocks = ops::cpu::tiled_matmul_blocks();
    model->forward(prompt, *state, /*all_logits=*/false);
    EXPECT_EQ(ops::cpu::tiled_matmul_blocks() > blocks, on) << "prefill, levers " << (on ? "default" : "off");
    const int64_t runs = ops::cpu::direct_matvec_runs();
    model->forward({13}, *state, /*all_logits=*/false);
    EXPECT_EQ(ops::cpu::direct_matvec_runs() > runs, on) << "decode, levers " << (on ? "default" : "off");
  }
}

}  // namespace
}  // namespace mere
