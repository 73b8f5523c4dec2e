// Same-offset batching on CUDA: up to kMaxMatvecTokens sequences the decode
// matvecs take every row with the arithmetic of one, so the tokens are those
// of each sequence alone; larger batches run the tensor-core GEMMs, whose sums
// differ in the last bits, and report the match.
// The engine's batched step (generate_batch over DecodeStep): graphed, eager,
// pipelined or not, it gives each sequence the tokens of generate_from alone,
// greedy and seeded; the engine's counters say which ran.
#include <gtest/gtest.h>

#include "core/device.h"
#include "models/batch_decode_util.h"
#include "gpu_test_util.h"
#include "test_util.h"

namespace mere {
namespace {

TEST(BatchDecodeGpu, SequencesGetTheirTokensAlone) {
  if (!cuda_available()) FAIL() << "gpu tests need a GPU: " << cuda_device_description();
  for (const char* family : {"llama", "qwen3", "qwen3_moe", "qwen3_moe-mlx4"}) {
    auto model = load_model(test::fixtures_dir() / family, Device::cuda);
    for (int batch : {3, 8, 12}) {
      const test::BatchComparison c = test::compare_batch_with_alone(*model, batch, 16);
      int same = 0, total = 0;
      for (int b = 0; b < batch; ++b)
        for (size_t i = 0; i < c.alone[size_t(b)].size(); ++i, ++total) same += c.alone[size_t(b)][i] == c.batched[size_t(b)][i];
      std::printf("[ gpu      ] %s batch %d: %d of %d greedy tokens as alone\n", family, batch, same, total);
      if (batch <= 8) EXPECT_EQ(same, total) << family << " batch " << batch;
      else EXPECT_GE(same, total / 2) << family << " batch " << batch;
    }
  }
}

// Lever fused_norm_matvec on an MLX int8 checkpoint: in a batch of 3 on one
// pool each layer's split-K attention leaves its partials unmerged for
// ops::attention_linear_add (the paged, batched path through KvCache and
// attend_cached). This fixture's o_proj (64 columns) is below the tensor-core
// matvec's stage, so the op merges first and then multiplies; the merge inside
// the prepare kernel is checked on its own (Affine.TensorCoreMatvecMerges...).
TEST(BatchDecodeGpu, FoldedUnmergedAttentionGivesTheUnfoldedTokens) {
  if (!cuda_available()) FAIL() << "gpu tests need a GPU: " << cuda_device_description();
  const auto dir = test::fixtures_dir() / "llama-mlx8";
  Levers folded_levers, plain_levers;
  folded_levers.fused_norm_matvec = LeverMode::on;
  plain_levers.fused_norm_matvec = LeverMode::off;
  auto folded = load_model(dir, Device::cuda, folded_levers.load_options(Device::cuda));
  auto plain = load_model(dir, Device::cuda, plain_levers.load_options(Device::cuda));
  ASSERT_TRUE(folded->info().folds_step(3));
  ASSERT_FALSE(plain->info().folds_step(3));
  const test::BatchComparison a = test::compare_batch_with_alone(*folded, 3, 16, /*one_pool=*/true);
  const test::BatchComparison b = test::compare_batch_with_alone(*plain, 3, 16, /*one_pool=*/true);
  int same = 0, total = 0;
  for (size_t s = 0; s < 3; ++s)
    for (size_t i = 0; i < a.batched[s].size(); ++i, ++total) same += a.batched[s][i] == b.batched[s][i];
  std::printf("[ gpu      ] llama-mlx8 batch 3, folded vs unfolded: %d of %d greedy tokens the same\n", same, total);
  EXPECT_GE(same, total * 3 / 4);
  // The first token of each sequence comes from the prefill, the second from the first batched step.
  for (size_t s = 0; s < 3; ++s) EXPECT_EQ(a.batched[s][1], b.batched[s][1]) << "sequence " << s;
}

class BatchDecodeLoopGpu : public test::NeedsGpu<::testing::TestWithParam<std::string>> {
 protected:
  std::unique_ptr<Model> load() const {
    const auto dir =
        test::model_dir(GetParam());
    return load_model(dir, Device::cuda, Levers{}.load_options(Device::cuda));
  }
};

GenerateOptions options_with(const SamplingParams& sampling, bool graphs, bool pipelined, bool kernel_slots = false) {
  GenerateOptions o;
  o.max_new_tokens = 24;
  o.sampling = sampling;
  o.levers.cuda_graphs = graphs;
  o.levers.pipelined_decode = pipelined;
  o.levers.kernel_token_slots = kernel_slots;
  return o;
}

// 24 tokens per sequence: the prefill's sample and 23 batched forwards. Graphed:
// the first forward runs eagerly and is captured, the other 22 are replays.
TEST_P(BatchDecodeLoopGpu, GraphedStepMatchesEagerAndAlone) {
  auto model = load();
  const std::vector<SamplingParams> samplings = {
      SamplingParams{.temperature = 0}, SamplingParams{.temperature = 1.0f, .seed = 7},
      SamplingParams{.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .repetition_penalty = 1.2f, .seed = 3}};
  for (int batch : {1, 3, 8})
    for (const SamplingParams& sampling : samplings) {
      const std::string label = fmt::format("{} B={} T={} seed={}", GetParam(), batch, sampling.temperature, sampling.seed);
      const auto graphed = test::compare_generate_batch_with_alone(*model, batch, options_with(sampling, true, true));
      const auto graphed_plain = test::compare_generate_batch_with_alone(*model, batch, options_with(sampling, true, false));
      const auto eager = test::compare_generate_batch_with_alone(*model, batch, options_with(sampling, false, false));
      const auto eager_piped = test::compare_generate_batch_with_alone(*model, batch, options_with(sampling, false, true));
      const auto slots = test::compare_generate_batch_with_alone(*model, batch, options_with(sampling, true, true, true));
      ASSERT_EQ(graphed.alone[0].size(), 24u) << label;
      test::expect_batch_as_alone(slots, label + " graphed, pipelined, kernel token slots");
      EXPECT_EQ(slots.batched, graphed.batched) << label;
      EXPECT_EQ(graphed.stats.token_copies, 24) << label;  // one a batched read
      EXPECT_EQ(slots.stats.token_copies, 1) << label;     // the prefill's sampling only
      test::expect_batch_as_alone(graphed, label + " graphed, pipelined");
      test::expect_batch_as_alone(graphed_plain, label + " graphed");
      test::expect_batch_as_alone(eager, label + " eager");
      test::expect_batch_as_alone(eager_piped, label + " eager, pipelined");
      EXPECT_EQ(graphed.batched, eager.batched) << label;
      for (const auto* c : {&graphed, &graphed_plain, &eager, &eager_piped}) {
        EXPECT_TRUE(c->stats.device_sampled) << label;
        EXPECT_EQ(c->stats.generated_tokens, 24 * batch) << label;
        EXPECT_EQ(c->stats.rolled_back_positions, 0) << label;
      }
      EXPECT_EQ(graphed.stats.graph_captures, 1) << label;
      EXPECT_EQ(graphed.stats.graph_replays, 22) << label;
      EXPECT_EQ(graphed.stats.eager_decode_steps, 0) << label;
      EXPECT_EQ(graphed.stats.pipelined_steps, 22) << label;  // every step but the first is queued ahead
      EXPECT_EQ(graphed_plain.stats.graph_captures, 1) << label;
      EXPECT_EQ(graphed_plain.stats.graph_replays, 22) << label;
      EXPECT_EQ(graphed_plain.stats.pipelined_steps, 0) << label;
      EXPECT_EQ(eager.stats.eager_decode_steps, 23) << label;
      EXPECT_EQ(eager.stats.graph_captures + eager.stats.graph_replays, 0) << label;
      EXPECT_EQ(eager_piped.stats.eager_decode_steps, 23) << label;
      std::printf("[ gpu      ] %s: 24 tokens per sequence as alone (graphed/eager, pipelined or not)\n",
                  label.c_str());
    }
}

// EOS for one sequence and a sink stop for another, found one step late by the
// pipelined graphed loop: each sequence keeps its tokens and length as alone,
// and the step queued past the last stop is rolled back.
TEST_P(BatchDecodeLoopGpu, StopsPerSequenceAsAlone) {
  auto model = load();
  const SamplingParams greedy{.temperature = 0};
  const auto free_run = test::compare_generate_batch_with_alone(*model, 3, options_with(greedy, true, true));
  for (bool graphs : {true, false}) {
    GenerateOptions o = options_with(greedy, graphs, true, /*kernel_slots=*/graphs);
    o.eos_ids = {free_run.alone[1][6]};  // sequence 1 stops at its first such token
    const auto c = test::compare_generate_batch_with_alone(*model, 3, o, /*stop_seq=*/2, /*stop_after=*/4);
    const std::string label = fmt::format("{} graphs={} kernel_token_slots={}", GetParam(), graphs, graphs);
    test::expect_batch_as_alone(c, label);
    EXPECT_EQ(c.stats.stop_reasons[1], "eos") << label;
    EXPECT_LE(c.batched[1].size(), 6u) << label;
    // The batch reads until its last sequence stops (read i: token i); a step
    // was queued past that read, and is rolled back, when 1 <= i < 23.
    size_t last_read = 0;
    for (size_t b = 0; b < 3; ++b)
      last_read = std::max(last_read, c.alone[b].size() - (c.alone_reason[b] == "eos" ? 0 : 1));
    EXPECT_EQ(c.stats.rolled_back_positions, last_read >= 1 && last_read + 1 < 24 ? 1 : 0) << label;
    std::printf("[ gpu      ] %s: EOS after %zu tokens, stop after %zu, lengths as alone\n", label.c_str(),
                c.batched[1].size(), c.batched[2].size());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, BatchDecodeLoopGpu, ::testing::Values("llama", "qwen2", "qwen3", "qwen3_moe", "demo"));

}  // namespace
}  // namespace mere
