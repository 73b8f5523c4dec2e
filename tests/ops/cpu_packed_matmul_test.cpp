// Lever cpu_packed_matmul (ops/cpu/packed_matmul.cpp): the tiled prefill product
// as an outer product of packed tokens, against the product computed here in
// double precision and against the dot-product tiles; where it applies; and that
// models reach it.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/levers.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"
#include "test_util.h"

namespace mere {
namespace {

// rows [n_rows, in] times x [T, in] into [T, n_out] (NaN where nothing is written), the lever on or off.
std::vector<float> rows_product(bool packed, const std::vector<float>& x, int64_t T, int64_t in,
                                const std::vector<float>& rows, int64_t n_rows, const float* bias, int64_t n_out) {
  const test::CpuLever tiled(ops::cpu::set_tiled_matmul, true);
  const test::CpuLever lever(ops::cpu::set_packed_matmul, packed);
  std::vector<float> out(static_cast<size_t>(T * n_out), NAN);
  const ops::cpu::TiledTokens tokens = ops::cpu::tiled_tokens(x.data(), T, in);
  EXPECT_TRUE(ops::cpu::tiled_rows_product(tokens, rows.data(), n_rows, bias, out.data(), n_out));
  return out;
}

// 64-400 tokens (tiles of 48, the rest of 1 or 2 vectors, a last vector part
// empty, blocks of 192), 1-37 rows (tiles of 8 and rests of 4, 2, 1), widths
// below, at and past a 512-column chunk, a bias or none, an output wider than
// the block. Each result within 1e-5 of the sum of its products' magnitudes (f32
// sums in another order, up to 512 a chunk in one register lane), against double.
TEST(CpuPackedMatmul, MatchesTheProductInDouble) {
  if (!ops::cpu::avx512_matmul_available()) GTEST_SKIP() << "this CPU has no AVX-512F";
  int checked = 0;
  test::check_rows_product_against_double(
      [](const std::vector<float>& x, int64_t T, int64_t in, const std::vector<float>& rows, int64_t n_rows,
         const float* bias, int64_t n_out) { return rows_product(true, x, T, in, rows, n_rows, bias, n_out); },
      {64, 65, 111, 193, 400}, {1, 7, 8, 16, 37}, {16, 100, 513, 1100}, 1e-5, ops::cpu::packed_matmul_blocks, checked);
  EXPECT_EQ(checked, 100);
}

// The tokens are packed only with the lever and cpu_tiled_matmul on, AVX-512F,
// and 64 tokens or more; otherwise the dot-product tiles serve.
TEST(CpuPackedMatmul, PacksOnlyWhereItApplies) {
  const std::vector<float> x = test::normal_values(70 * 64, 2, 0.0f, 1.0f);
  const bool avx512 = ops::cpu::avx512_matmul_available();
  {
    const test::CpuLever tiled(ops::cpu::set_tiled_matmul, true);
    const test::CpuLever lever(ops::cpu::set_packed_matmul, true);
    const ops::cpu::TiledTokens tokens = ops::cpu::tiled_tokens(x.data(), 70, 64);
    ASSERT_EQ(tokens.packed.defined(), avx512);
    if (avx512) {  // token 65, column 5 at [group 4][column 5][lane 1]; token 70 (past T) zero
      ASSERT_EQ(tokens.packed.shape(), (Shape{5, 64, 16}));
      EXPECT_EQ(tokens.packed.data<float>()[(4 * 64 + 5) * 16 + 1], x[size_t(65 * 64 + 5)]);
      EXPECT_EQ(tokens.packed.data<float>()[(4 * 64 + 5) * 16 + 6], 0.0f);
    }
    EXPECT_FALSE(ops::cpu::tiled_tokens(x.data(), 63, 64).packed.defined());
  }
  {
    const test::CpuLever tiled(ops::cpu::set_tiled_matmul, true);
    const test::CpuLever lever(ops::cpu::set_packed_matmul, false);
    EXPECT_FALSE(ops::cpu::tiled_tokens(x.data(), 70, 64).packed.defined());
  }
  {
    const test::CpuLever tiled(ops::cpu::set_tiled_matmul, false);
    const test::CpuLever lever(ops::cpu::set_packed_matmul, true);
    EXPECT_FALSE(ops::cpu::tiled_tokens(x.data(), 70, 64).packed.defined());
  }
  const std::vector<float> rows = test::normal_values(8 * 64, 1, 0.0f, 0.05f);
  const int64_t blocks = ops::cpu::packed_matmul_blocks();
  const std::vector<float> dot = rows_product(false, x, 70, 64, rows, 8, nullptr, 8);
  EXPECT_EQ(ops::cpu::packed_matmul_blocks(), blocks);
  const std::vector<float> outer = rows_product(true, x, 70, 64, rows, 8, nullptr, 8);
  EXPECT_EQ(ops::cpu::packed_matmul_blocks() > blocks, avx512);
  for (size_t i = 0; i < dot.size(); ++i) EXPECT_NEAR(outer[i], dot[i], 1e-5f) << i;
}

// A CPU model's prefill takes it from its load options (a 70-token prompt
// packs), and its logits stay within f32 reordering of the dot tiles'.
TEST(CpuPackedMatmul, ACpuModelsPrefillRunsWithTheLever) {
  std::vector<int32_t> prompt(70);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(1 + (i * 37) % 500);
  const auto runs = test::demo_prefill_off_on([](Levers& l, bool on) { l.cpu_packed_matmul = on; }, prompt,
                                              ops::cpu::packed_matmul_blocks);
  EXPECT_FALSE(runs[0].counted);
  EXPECT_EQ(runs[1].counted, ops::cpu::avx512_matmul_available());
  EXPECT_LE(test::worst_difference(runs[0].logits, runs[1].logits), 1e-4f);
}

}  // namespace
}  // namespace mere
