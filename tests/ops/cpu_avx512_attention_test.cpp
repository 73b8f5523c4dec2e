// Lever cpu_avx512_attention (ops/cpu/avx512_attention.cpp): a prefill tile's
// scores and weighted values as outer products in 512-bit registers, against
// attention computed in double precision and against the AVX2 tiles; where it
// applies; and that models reach it.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/levers.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"
#include "test_util.h"

namespace mere {
namespace {

Tensor attention_with(bool avx512, const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale) {
  const test::CpuLever vector(ops::cpu::set_vector_attention, true);
  const test::CpuLever lever(ops::cpu::set_avx512_attention, avx512);
  return ops::attention(q, k, v, pos0, scale);
}

using Case = test::AttentionCase;

// Tiles of 8-64 query rows: groups of 1, 2, 3, 4 and 7 query heads a kv head
// (row groups of 8 for the scores and 6 for the values, and their rests of 4,
// 2, 1), head_dim 64, 128, 80, 72 and 256 (4-vector steps of the values, a
// masked rest of 8 lanes, several key blocks: 64 keys a block at head_dim 128,
// 32 at 256), prompts of 8-70 tokens after 0-300 cached keys (key counts off a
// multiple of 16; a tile's rows seeing different keys). Values of order 1: the
// bound is absolute, 2e-6 against double, as for the AVX2 tiles.
TEST(CpuAvx512Attention, MatchesDoublePrecisionAttention) {
  if (!ops::cpu::avx512_matmul_available()) GTEST_SKIP() << "this CPU has no AVX-512F";
  int checked = 0;
  for (const Case& c : {Case{8, 8, 8, 128, 0}, Case{21, 16, 8, 128, 300}, Case{37, 6, 2, 64, 290},
                        Case{33, 8, 2, 256, 3}, Case{9, 32, 8, 72, 0}, Case{70, 28, 4, 80, 17},
                        Case{12, 12, 3, 64, 1}, Case{64, 2, 2, 128, 100}}) {
    const test::AttentionProblem p = test::random_attention_problem(c);
    const int64_t tiles = ops::cpu::avx512_attention_tiles();
    const Tensor got = attention_with(true, p.q, p.k, p.v, c.pos0, p.scale);
    EXPECT_GT(ops::cpu::avx512_attention_tiles(), tiles) << p.label;
    EXPECT_LE(test::worst_error(got, p.want), 2e-6) << p.label;
    EXPECT_LE(test::worst_error(attention_with(false, p.q, p.k, p.v, c.pos0, p.scale), p.want), 2e-6)
        << p.label << " (AVX2)";
    ++checked;
  }
  EXPECT_EQ(checked, 8);
}

// Scores far apart in a prefill tile: a key that takes nearly all the weight
// and keys whose weights fall below 2^-126 (e^x flushed to 0) keep the result.
TEST(CpuAvx512Attention, KeepsSharpSoftmaxes) {
  if (!ops::cpu::avx512_matmul_available()) GTEST_SKIP() << "this CPU has no AVX-512F";
  const int64_t T = 12, pos0 = 25, n = pos0 + T, D = 64;
  Tensor q = test::normal_tensor({T, 2, D}, 1, 1.0f), k = test::normal_tensor({n, 1, D}, 2, 1.0f),
         v = test::normal_tensor({n, 1, D}, 3, 1.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i) q.data<float>()[(t * 2) * D + i] = 3.0f;  // head 0 aligns with key 17
  for (int64_t i = 0; i < D; ++i) k.data<float>()[17 * D + i] = 3.0f, k.data<float>()[5 * D + i] = -3.0f;
  const int64_t tiles = ops::cpu::avx512_attention_tiles();
  const Tensor got = attention_with(true, q, k, v, pos0, 1.0f);
  EXPECT_GT(ops::cpu::avx512_attention_tiles(), tiles);
  EXPECT_LE(test::worst_error(got, test::reference_attention(q, k, v, pos0, 1.0f)), 2e-6);
}

// Uninitialized cache rows past the last token (NaN here) are never read: a
// 40-token prefill into a cache of 100 rows.
TEST(CpuAvx512Attention, ReadsNoKeyPastTheLastToken) {
  if (!ops::cpu::avx512_matmul_available()) GTEST_SKIP() << "this CPU has no AVX-512F";
  const int64_t T = 40, rows = 100, D = 64;
  const Tensor q = test::normal_tensor({T, 4, D}, 1, 1.0f);
  Tensor k = test::normal_tensor({rows, 2, D}, 2, 1.0f), v = test::normal_tensor({rows, 2, D}, 3, 1.0f);
  for (int64_t i = T * 2 * D; i < rows * 2 * D; ++i) k.data<float>()[i] = v.data<float>()[i] = NAN;
  const Tensor got = attention_with(true, q, k.slice_rows(0, T), v.slice_rows(0, T), 0, 0.125f);
  for (int64_t i = 0; i < got.numel(); ++i) ASSERT_TRUE(std::isfinite(got.at(i))) << i;
}

// Tiles of fewer than 8 rows (a decode step, a 3-token prompt of one head a kv
// head), the lever off, or no AVX-512F: the AVX2 tiles serve.
TEST(CpuAvx512Attention, RunsOnlyWhereItApplies) {
  const Tensor k = test::normal_tensor({20, 2, 64}, 2, 1.0f), v = test::normal_tensor({20, 2, 64}, 3, 1.0f);
  const int64_t tiles = ops::cpu::avx512_attention_tiles();
  attention_with(true, test::normal_tensor({1, 8, 64}, 1, 1.0f), k, v, 19, 0.125f);   // decode: 4 rows a tile
  attention_with(true, test::normal_tensor({3, 2, 64}, 4, 1.0f), k.slice_rows(0, 3), v.slice_rows(0, 3), 0, 0.125f);
  attention_with(false, test::normal_tensor({20, 8, 64}, 5, 1.0f), k, v, 0, 0.125f);  // the lever off
  EXPECT_EQ(ops::cpu::avx512_attention_tiles(), tiles);
  attention_with(true, test::normal_tensor({20, 8, 64}, 5, 1.0f), k, v, 0, 0.125f);
  EXPECT_EQ(ops::cpu::avx512_attention_tiles() > tiles, ops::cpu::avx512_matmul_available());
}

// A CPU model's prefill takes it from its load options, and its logits stay
// within f32 reordering of the AVX2 tiles'.
TEST(CpuAvx512Attention, ACpuModelsPrefillRunsWithTheLever) {
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(1 + (i * 53) % 700);
  const auto runs = test::demo_prefill_off_on([](Levers& l, bool on) { l.cpu_avx512_attention = on; }, prompt,
                                              ops::cpu::avx512_attention_tiles);
  EXPECT_FALSE(runs[0].counted);
  EXPECT_EQ(runs[1].counted, ops::cpu::avx512_matmul_available());
  EXPECT_LE(test::worst_difference(runs[0].logits, runs[1].logits), 1e-4f);
}

}  // namespace
}  // namespace mere
