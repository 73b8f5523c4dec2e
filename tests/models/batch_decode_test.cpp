// Same-offset decode batching: several sequences at one position decode in one
// forward (their rows batched through every matmul, each attending to its own
// cache) and get exactly the tokens each gets alone (greedy), through
// Model::forward_batch and through the engine's generate_batch (greedy and
// seeded sampling, with stops).
#include <gtest/gtest.h>

#include "models/batch_decode_util.h"
#include "models/model.h"
#include "test_util.h"

namespace mere {
namespace {

using test::BatchComparison;
using test::compare_batch_with_alone;

class BatchDecode : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchDecode, EachSequenceGetsItsTokensAlone) {
  const auto dir = test::model_dir(GetParam());
  auto model = load_model(dir);
  const BatchComparison c = compare_batch_with_alone(*model, 3, 12);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(c.batched[size_t(b)], c.alone[size_t(b)]) << "sequence " << b;
}

// The engine's batched loop on the CPU (eager, host sampler per row): each
// sequence's tokens and final length as generate_from gives it alone.
TEST_P(BatchDecode, GenerateBatchGivesEachSequenceItsTokensAlone) {
  const auto dir = test::model_dir(GetParam());
  auto model = load_model(dir);
  for (const SamplingParams& sampling :
       {SamplingParams{.temperature = 0}, SamplingParams{.temperature = 0.8f, .top_k = 40, .repetition_penalty = 1.2f, .seed = 3}}) {
    GenerateOptions options;
    options.max_new_tokens = 8;
    options.sampling = sampling;
    const test::GenerateComparison c = test::compare_generate_batch_with_alone(*model, 3, options);
    test::expect_batch_as_alone(c, fmt::format("{} T={}", GetParam(), sampling.temperature));
    EXPECT_EQ(c.stats.eager_decode_steps, 7);  // 8 tokens: the prefill's and 7 batched forwards
    EXPECT_EQ(c.stats.graph_captures + c.stats.graph_replays, 0);
    EXPECT_EQ(c.stats.generated_tokens, 3 * 8);
  }
}

// States on one pool: each layer writes the batch's K/V and attends in one call
// over the batch's block tables (the path CUDA runs as one launch), fused
// rope-store (the CPU's composition) or not.
TEST(BatchDecode, OnePoolBatchGetsItsTokensAlone) {
  for (const char* family : {"llama", "qwen3", "qwen3_moe"})
    for (bool fused : {false, true}) {
      auto model = load_model(test::fixtures_dir() / family, Device::cpu, LoadOptions{.fuse_rope_store = fused});
      for (KvCacheMode mode : {KvCacheMode::native, KvCacheMode::affine4}) {
        const BatchComparison c = compare_batch_with_alone(*model, 3, 8, /*one_pool=*/true, mode);
        for (int b = 0; b < 3; ++b)
          EXPECT_EQ(c.batched[size_t(b)], c.alone[size_t(b)])
              << family << " sequence " << b << " fused " << fused << " kv " << kv_cache_mode_name(mode);
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Models, BatchDecode, ::testing::Values("llama", "qwen3", "qwen3_moe", "demo"));

// One sequence hits EOS, another is stopped by its sink: each keeps its own
// tokens and ends at the length it would have alone, the others run on.
TEST(BatchDecode, GenerateBatchStopsSequencesSeparately) {
  auto model = load_model(test::fixtures_dir() / "qwen3");
  GenerateOptions options;
  options.max_new_tokens = 10;
  options.sampling.temperature = 0;
  const test::GenerateComparison free_run = test::compare_generate_batch_with_alone(*model, 3, options);
  options.eos_ids = {free_run.alone[1][4]};  // sequence 1's fifth token
  const test::GenerateComparison c = test::compare_generate_batch_with_alone(*model, 3, options, /*stop_seq=*/2, 3);
  test::expect_batch_as_alone(c, "qwen3 eos and stop");
  EXPECT_EQ(c.stats.stop_reasons[1], "eos");
  EXPECT_EQ(c.stats.stop_reasons[2], "stop");
  EXPECT_LE(c.batched[1].size(), 4u);  // EOS itself is not passed on
  EXPECT_EQ(c.batched[2].size(), 3u);
}

TEST(BatchDecode, GenerateBatchRefusesDifferentOffsets) {
  auto model = load_model(test::fixtures_dir() / "qwen3");
  auto a = model->make_state(32), b = model->make_state(32);
  std::vector<SeqState*> raw{a.get(), b.get()};
  GenerateOptions options;
  EXPECT_THROW(generate_batch(*model, raw, {{1, 2, 3}, {1, 2}}, options, [](int64_t, int32_t) { return true; }), Error);
}

TEST(BatchDecode, SequencesAtDifferentOffsetsAreRefused) {
  auto model = load_model(test::fixtures_dir() / "qwen3");
  auto a = model->make_state(32), b = model->make_state(32);
  model->forward({1, 2, 3}, *a, false);
  model->forward({1, 2}, *b, false);
  EXPECT_THROW(model->forward_batch({4, 5}, {a.get(), b.get()}), Error);
  EXPECT_EQ(a->length(), 3);
  EXPECT_EQ(b->length(), 2);
}

}  // namespace
}  // namespace mere
