// Lever cpu_avx512_matmul (ops/cpu/avx512_matmul.cpp): the tiled prefill
// product in 512-bit registers, against the product computed here in double
// precision and against the AVX2 tile; and that models and the audit reach it.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/levers.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"
#include "test_util.h"

namespace mere {
namespace {

// rows [n_rows, in] times x [T, in] into [T, n_out] with the lever on or off.
std::vector<float> rows_product(bool avx512, const std::vector<float>& x, int64_t T, int64_t in,
                                const std::vector<float>& rows, int64_t n_rows, const float* bias, int64_t n_out) {
  const test::CpuLever tiled(ops::cpu::set_tiled_matmul, true);
  const test::CpuLever lever(ops::cpu::set_avx512_matmul, avx512);
  std::vector<float> out(static_cast<size_t>(T * n_out), NAN);
  EXPECT_TRUE(ops::cpu::tiled_rows_product(ops::cpu::tiled_tokens(x.data(), T, in), rows.data(), n_rows, bias, out.data(),
                                           n_out));
  return out;
}

// 1-40 tokens (passes of 6 and every rest), 1-37 rows (tiles of 4 and every
// rest), widths of whole 16-column steps and with a masked last step, a bias or
// none, an output wider than the block. Each result within 2e-6 of the sum of
// its products' magnitudes (f32 sums in another order), against double.
TEST(CpuAvx512Matmul, MatchesTheProductInDouble) {
  if (!ops::cpu::avx512_matmul_available()) GTEST_SKIP() << "this CPU has no AVX-512F";
  int checked = 0;
  test::check_rows_product_against_double(
      [](const std::vector<float>& x, int64_t T, int64_t in, const std::vector<float>& rows, int64_t n_rows,
         const float* bias, int64_t n_out) { return rows_product(true, x, T, in, rows, n_rows, bias, n_out); },
      {1, 5, 6, 7, 13, 40}, {1, 3, 4, 16, 37}, {16, 100, 1024, 3000}, 2e-6, ops::cpu::avx512_matmul_blocks, checked);
  EXPECT_EQ(checked, 120);
}

// Off, or on a CPU without AVX-512F, the AVX2 tile serves.
TEST(CpuAvx512Matmul, RunsOnlyWhereItApplies) {
  const std::vector<float> rows = test::normal_values(8 * 64, 1, 0.0f, 0.05f), x = test::normal_values(3 * 64, 2, 0.0f, 1.0f);
  const int64_t blocks = ops::cpu::avx512_matmul_blocks();
  const std::vector<float> avx2 = rows_product(false, x, 3, 64, rows, 8, nullptr, 8);
  EXPECT_EQ(ops::cpu::avx512_matmul_blocks(), blocks);
  rows_product(true, x, 3, 64, rows, 8, nullptr, 8);
  EXPECT_EQ(ops::cpu::avx512_matmul_blocks() > blocks, ops::cpu::avx512_matmul_available());
}

// A CPU model's prefill takes it from its load options, dense and quantized,
// and its logits stay within f32 reordering of the AVX2 tile's.
TEST(CpuAvx512Matmul, ACpuModelsPrefillRunsWithTheLever) {
  const auto runs = test::demo_prefill_off_on([](Levers& l, bool on) { l.cpu_avx512_matmul = on; },
                                              {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17},
                                              ops::cpu::avx512_matmul_blocks);
  EXPECT_FALSE(runs[0].counted);
  EXPECT_EQ(runs[1].counted, ops::cpu::avx512_matmul_available());
  EXPECT_LE(test::worst_difference(runs[0].logits, runs[1].logits), 1e-4f);
}

}  // namespace
}  // namespace mere
