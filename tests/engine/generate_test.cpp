// The host decode loop's statistics: the decode rate is timed however generation ends.
// Before, an EOS, a stop from the sink or a full context returned before the timing, so
// `mere text generate` printed "decode: N tokens, 0.0 tok/s" for most chats.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/generate.h"
#include "models/model.h"
#include "test_util.h"

namespace mere {
namespace {

TEST(Generate, DecodeRateIsTimedHoweverGenerationEnds) {
  auto model = load_model(test::source_dir() / "models" / "demo", Device::cpu);
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  GenerateOptions options;
  options.sampling.temperature = 0;
  options.eos_ids = {};
  options.max_new_tokens = 12;
  std::vector<int32_t> greedy;
  GenerateStats stats = generate(*model, prompt, options, [&](int32_t id) {
    greedy.push_back(id);
    return true;
  });
  ASSERT_EQ(stats.stop_reason, "length");
  EXPECT_GT(stats.decode_tok_s(), 0);

  // A sink that stops after six tokens.
  int64_t taken = 0;
  stats = generate(*model, prompt, options, [&](int32_t) { return ++taken < 6; });
  EXPECT_EQ(stats.stop_reason, "stop");
  EXPECT_EQ(stats.generated_tokens, 6);
  EXPECT_GT(stats.decode_tok_s(), 0);

  // An end-of-sequence token: the first greedy token from the fourth on not seen before it.
  size_t at = 3;
  while (at < greedy.size() && std::find(greedy.begin(), greedy.begin() + long(at), greedy[at]) !=
                                   greedy.begin() + long(at))
    ++at;
  ASSERT_LT(at, greedy.size()) << "the greedy continuation repeats itself";
  options.eos_ids = {greedy[at]};
  stats = generate(*model, prompt, options, [](int32_t) { return true; });
  EXPECT_EQ(stats.stop_reason, "eos");
  EXPECT_EQ(stats.generated_tokens, int64_t(at) + 1);
  EXPECT_GT(stats.decode_tok_s(), 0);

  // A full context: a budget past the model's context stops where it ends.
  options.eos_ids = {};
  options.max_new_tokens = int(model->info().max_positions) + 10;
  stats = generate(*model, prompt, options, [](int32_t) { return true; });
  EXPECT_EQ(stats.stop_reason, "context");
  EXPECT_GT(stats.decode_tok_s(), 0);
}

}  // namespace
}  // namespace mere
