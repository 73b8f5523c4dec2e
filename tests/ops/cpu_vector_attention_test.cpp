// Lever cpu_vector_attention (ops/cpu/attention.cpp): the CPU's attention by one
// task per token and kv head in AVX2 registers, against attention computed here
// in double precision and against the scalar form.
#include <gtest/gtest.h>

#include <cmath>

#include "core/thread_pool.h"
#include "engine/levers.h"
#include "models/model.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"
#include "test_util.h"

namespace mere {
namespace {

Tensor attention_with(bool vector, const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale) {
  const test::CpuLever lever(ops::cpu::set_vector_attention, vector);
  return ops::attention(q, k, v, pos0, scale);
}

using Case = test::AttentionCase;

// Groups of 1, 2, 3, 4 and 7 query heads a kv head (pairs and a single), head_dim
// 64, 128, 80 and 72 (32-dimension steps and 8-dimension rests), 1-9 tokens after
// 0, 5 or 300 cached keys (4-key steps and a rest of 1-3); prompts of 21-37 tokens
// make tiles of several tokens (packed blocks; pairs across two tokens; a last
// tile part-filled; keys past one block). Values are of order 1,
// so the bound is absolute: 2e-6 against double, where the scalar form's own
// error is of the same order.
TEST(CpuVectorAttention, MatchesDoublePrecisionAttention) {
  int checked = 0;
  for (const Case& c : {Case{1, 16, 8, 128, 300}, Case{1, 14, 2, 64, 301}, Case{3, 4, 4, 80, 5}, Case{9, 32, 8, 72, 0},
                        Case{2, 8, 2, 128, 0}, Case{1, 7, 1, 64, 1}, Case{37, 6, 2, 64, 290},
                        Case{21, 8, 8, 128, 0}, Case{33, 8, 2, 256, 3}}) {
    const test::AttentionProblem p = test::random_attention_problem(c);
    const int64_t runs = ops::cpu::vector_attention_runs();
    const Tensor got = attention_with(true, p.q, p.k, p.v, c.pos0, p.scale);
    if (ops::cpu::vector_attention_runs() == runs) GTEST_SKIP() << "no AVX2 build: the scalar form serves";
    EXPECT_LE(test::worst_error(got, p.want), 2e-6) << p.label;
    EXPECT_LE(test::worst_error(attention_with(false, p.q, p.k, p.v, c.pos0, p.scale), p.want), 2e-6)
        << p.label << " (scalar)";
    ++checked;
  }
  EXPECT_EQ(checked, 9);
}

// A bf16 cache is read as it is stored (its rows widened in registers), in
// each form: a decode step of one or two rows a kv head read in place, one of
// four rows (packed blocks), one split into runs, prefill tiles (AVX2 and, where
// the CPU has AVX-512F, the 512-bit form), and the scalar form (the lever off:
// an f32 copy). Against double attention on the same bf16 values, within 2e-6.
TEST(CpuVectorAttention, ReadsABf16CacheAsStored) {
  for (const Case& c : {Case{1, 16, 8, 128, 300}, Case{1, 8, 2, 64, 40}, Case{1, 4, 1, 64, 1500},
                        Case{21, 16, 8, 128, 30}, Case{37, 6, 2, 64, 290}, Case{9, 32, 8, 72, 0}}) {
    const test::AttentionProblem p = test::random_attention_problem(c, DType::bf16);
    for (bool avx512 : {false, true}) {
      const test::CpuLever wide(ops::cpu::set_avx512_attention, avx512);
      const int64_t runs = ops::cpu::vector_attention_runs();
      EXPECT_LE(test::worst_error(attention_with(true, p.q, p.k, p.v, c.pos0, p.scale), p.want), 2e-6) << p.label;
#ifdef __AVX2__
      EXPECT_GT(ops::cpu::vector_attention_runs(), runs) << p.label;
#endif
    }
    EXPECT_LE(test::worst_error(attention_with(false, p.q, p.k, p.v, c.pos0, p.scale), p.want), 2e-6)
        << p.label << " (scalar)";
  }
}

// A quantized cache (affine8, affine4) is read as stored where each kv head's
// rows go to one tile: a decode step of two, three or four rows a kv head, one
// split into runs, a 3-token step, head_dim 40 (4-bit groups of 40: a rest of 8
// codes) and 128 (two groups), with cpu_avx512_attention off and on (its
// 512-bit form takes tiles of 8 rows or more: none here). A 40-token prompt (two
// tiles) dequantizes the visible rows first, as the lever off does. Against
// double attention on the dequantized values, within 2e-6.
TEST(CpuVectorAttention, ReadsAQuantizedCacheAsStored) {
  struct QuantCase {
    Case c;
    bool reads_codes;
  };
  for (const QuantCase& qc : {QuantCase{{1, 16, 8, 128, 300}, true}, QuantCase{{1, 6, 2, 64, 40}, true},
                              QuantCase{{1, 32, 8, 128, 70}, true}, QuantCase{{1, 4, 1, 64, 1500}, true},
                              QuantCase{{1, 4, 2, 40, 77}, true}, QuantCase{{3, 4, 2, 128, 20}, true},
                              QuantCase{{40, 16, 8, 128, 30}, false}}) {
    const Case& c = qc.c;
    for (int bits : {8, 4}) {
      const uint32_t seed = uint32_t(c.T * 100 + c.heads + c.pos0 + bits);
      const int64_t n = c.pos0 + c.T;
      const Tensor q = test::normal_tensor({c.T, c.heads, c.head_dim}, seed, 1.0f);
      const Shape rows{n, c.kv_heads, c.head_dim};
      const ops::AffineRows k = ops::quantize_kv_rows(test::normal_tensor(rows, seed + 1, 1.0f), bits);
      const ops::AffineRows v = ops::quantize_kv_rows(test::normal_tensor(rows, seed + 2, 1.0f), bits);
      const float scale = 1.0f / std::sqrt(float(c.head_dim));
      const std::vector<double> want = test::reference_attention(
          q, ops::dequantize_kv_rows(k, n, c.head_dim), ops::dequantize_kv_rows(v, n, c.head_dim), c.pos0, scale);
      const std::string what = "T " + std::to_string(c.T) + " heads " + std::to_string(c.heads) + "/" +
                               std::to_string(c.kv_heads) + " dim " + std::to_string(c.head_dim) + " pos0 " +
                               std::to_string(c.pos0) + " bits " + std::to_string(bits);
      for (bool vector : {true, false})
        for (bool avx512 : {false, true}) {
          const test::CpuLever lever(ops::cpu::set_vector_attention, vector);
          const test::CpuLever wide(ops::cpu::set_avx512_attention, avx512);
          const int64_t reads = ops::cpu::attention_code_reads();
          EXPECT_LE(test::worst_error(ops::attention(q, k, v, c.pos0, scale), want), 2e-6)
              << what << " vector " << vector << " avx512 " << avx512;
#ifdef __AVX2__
          EXPECT_EQ(ops::cpu::attention_code_reads() - reads, vector && qc.reads_codes ? 1 : 0) << what;
#endif
        }
    }
  }
}

// A decode step with fewer kv heads than threads splits its keys into runs of
// 256 or more across the threads and merges them: one kv head at 700 and 1,500
// cached keys, and two at 2,000 (split where the machine has more than 2 threads).
TEST(CpuVectorAttention, DecodeSplitsItsKeysAcrossThreads) {
  for (const Case& c : {Case{1, 8, 1, 128, 700}, Case{1, 3, 1, 64, 1500}, Case{1, 4, 2, 64, 2000}}) {
    const Tensor q = test::normal_tensor({1, c.heads, c.head_dim}, 7, 1.0f);
    const Tensor k = test::normal_tensor({c.pos0 + 1, c.kv_heads, c.head_dim}, 8, 1.0f);
    const Tensor v = test::normal_tensor({c.pos0 + 1, c.kv_heads, c.head_dim}, 9, 1.0f);
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    const int64_t splits = ops::cpu::attention_decode_run_splits(), runs = ops::cpu::vector_attention_runs();
    const Tensor got = attention_with(true, q, k, v, c.pos0, scale);
    if (ops::cpu::vector_attention_runs() == runs) GTEST_SKIP() << "no AVX2 build: the scalar form serves";
    const bool split = ops::cpu::attention_decode_run_splits() > splits;
    EXPECT_EQ(split, thread_count() > c.kv_heads) << "kv heads " << c.kv_heads << ", threads " << thread_count();
    EXPECT_LE(test::worst_error(got, test::reference_attention(q, k, v, c.pos0, scale)), 2e-6) << "pos0 " << c.pos0;
  }
}

// Scores far apart: a key that takes nearly all the weight and keys whose
// weights fall below 2^-126 (e^x flushed to 0) keep the result.
TEST(CpuVectorAttention, KeepsSharpSoftmaxes) {
  const int64_t n = 40, D = 64;
  Tensor q = test::normal_tensor({1, 2, D}, 1, 1.0f), k = test::normal_tensor({n, 1, D}, 2, 1.0f),
         v = test::normal_tensor({n, 1, D}, 3, 1.0f);
  for (int64_t i = 0; i < D; ++i) {
    q.data<float>()[i] = 3.0f;                // head 0 aligns with key 17
    k.data<float>()[17 * D + i] = 3.0f;
    k.data<float>()[5 * D + i] = -3.0f;       // and is far from key 5
  }
  const std::vector<double> want = test::reference_attention(q, k, v, n - 1, 1.0f);
  const Tensor got = attention_with(true, q, k, v, n - 1, 1.0f);
  EXPECT_LE(test::worst_error(got, want), 2e-6);
}

// Where the form does not apply (head_dim not a multiple of 8, the lever off)
// the scalar form runs.
TEST(CpuVectorAttention, RunsOnlyWhereItApplies) {
  const Tensor q = test::normal_tensor({1, 4, 36}, 1, 1.0f), k = test::normal_tensor({5, 2, 36}, 2, 1.0f),
               v = test::normal_tensor({5, 2, 36}, 3, 1.0f);
  const int64_t runs = ops::cpu::vector_attention_runs();
  attention_with(true, q, k, v, 4, 0.2f);
  attention_with(false, test::normal_tensor({1, 4, 64}, 4, 1.0f), test::normal_tensor({5, 2, 64}, 5, 1.0f),
                 test::normal_tensor({5, 2, 64}, 6, 1.0f), 4, 0.2f);
  EXPECT_EQ(ops::cpu::vector_attention_runs(), runs);
}

// A CPU model sets the lever from its load options.
TEST(CpuVectorAttention, ACpuModelRunsWithTheLever) {
  for (bool on : {true, false}) {
    Levers levers;
    levers.cpu_vector_attention = on;
    const std::unique_ptr<Model> model =
        load_model(test::model_dir("demo"), Device::cpu, levers.load_options(Device::cpu));
    auto state = model->make_state(16);
    const int64_t runs = ops::cpu::vector_attention_runs();
    model->forward({1, 2, 3}, *state, /*all_logits=*/false);
    model->forward({4}, *state, /*all_logits=*/false);
    const bool ran = ops::cpu::vector_attention_runs() > runs;
#ifdef __AVX2__
    EXPECT_EQ(ran, on) << "lever " << (on ? "on" : "off");
#else
    EXPECT_FALSE(ran);
#endif
  }
  ops::set_cpu_settings({});  // the CPU kernels as before any model set them, for the tests after in this process
}

}  // namespace
}  // namespace mere
