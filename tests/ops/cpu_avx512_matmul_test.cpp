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
  for (int64_t T : {1, 5, 6, 7, 13, 40})
    for (int64_t n_rows : {1, 3, 4, 16, 37})
      for (int64_t in : {16, 100, 1024, 3000}) {
        const uint32_t seed = uint32_t(T * 1000 + n_rows * 10 + in);
        const std::vector<float> rows = test::normal_values(n_rows * in, seed, 0.0f, 0.05f);
        const std::vector<float> x = test::normal_values(T * in, seed + 1, 0.3f, 1.0f);
        const std::vector<float> bias = test::normal_values(n_rows, seed + 2, 0.0f, 1.0f);
        const int64_t n_out = n_rows + 3;
        const bool with_bias = (T + n_rows) % 2 == 0;
        const int64_t blocks = ops::cpu::avx512_matmul_blocks();
        const std::vector<float> got =
            rows_product(true, x, T, in, rows, n_rows, with_bias ? bias.data() : nullptr, n_out);
        EXPECT_EQ(ops::cpu::avx512_matmul_blocks(), blocks + 1);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t r = 0; r < n_rows; ++r) {
            double want = with_bias ? bias[size_t(r)] : 0.0, magnitude = std::fabs(want);
            for (int64_t i = 0; i < in; ++i) {
              const double p = double(rows[size_t(r * in + i)]) * double(x[size_t(t * in + i)]);
              want += p;
              magnitude += std::fabs(p);
            }
            ASSERT_NEAR(got[size_t(t * n_out + r)], want, 2e-6 * magnitude)
                << "T " << T << " rows " << n_rows << " in " << in << " at token " << t << " row " << r;
          }
        for (int64_t t = 0; t < T; ++t)  // columns past the block untouched
          for (int64_t r = n_rows; r < n_out; ++r) ASSERT_TRUE(std::isnan(got[size_t(t * n_out + r)]));
        ++checked;
      }
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
