// The embedded demo model (models/demo, and its draft) against the figures
// transformers recorded at training time: greedy continuations and held-out perplexity.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/generate.h"
#include "engine/perplexity.h"
#include "io/config.h"
#include "models/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mere {
namespace {

std::filesystem::path demo_dir() { return test::source_dir() / "models" / "demo"; }

class DemoModel : public ::testing::TestWithParam<std::string> {
 protected:
  std::filesystem::path dir() const { return GetParam() == "main" ? demo_dir() : demo_dir() / "draft"; }
  nlohmann::json reference() const {
    return nlohmann::json::parse(test::read_file(demo_dir() / "reference.json"))["models"][GetParam()];
  }
};

TEST_P(DemoModel, GreedyContinuationsMatchTransformers) {
  auto model = load_model(dir());
  Tokenizer tokenizer = Tokenizer::load(dir());
  GenerationConfig gen = GenerationConfig::load(dir());
  int checked = 0;
  const nlohmann::json ref = reference();
  for (const auto& case_ : ref["greedy"]) {
    std::string prompt = case_["prompt"];
    std::vector<int32_t> ids = tokenizer.encode(prompt, /*add_special_tokens=*/false);
    ASSERT_EQ(ids, case_["prompt_ids"].get<std::vector<int32_t>>()) << prompt;
    std::vector<int32_t> want = case_["output_ids"].get<std::vector<int32_t>>();
    GenerateOptions options;
    options.max_new_tokens = int(want.size());
    options.sampling.temperature = 0;
    options.eos_ids = gen.eos_token_ids;
    std::vector<int32_t> got;
    generate(*model, ids, options, [&](int32_t id) {
      got.push_back(id);
      return true;
    });
    if (!want.empty() && std::find(gen.eos_token_ids.begin(), gen.eos_token_ids.end(), want.back()) !=
                             gen.eos_token_ids.end())
      got.push_back(want.back());  // generate() does not hand the EOS token to the sink
    EXPECT_EQ(got, want) << prompt;
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST_P(DemoModel, HeldOutPerplexityWithinOnePercentOfTransformers) {
  auto model = load_model(dir());
  Tokenizer tokenizer = Tokenizer::load(dir());
  auto recorded = reference()["ppl"]["heldout_test.txt"];
  std::vector<int32_t> ids = tokenizer.encode(test::read_file(demo_dir() / "heldout_test.txt"), false);
  ASSERT_EQ(int64_t(ids.size()), recorded["tokens"].get<int64_t>());
  PerplexityResult r = perplexity(*model, ids, 256, 128);
  double want = recorded["ppl"];
  std::printf("[ demo     ] %s: heldout_test.txt ppl %.4f (transformers %.4f), %lld tokens scored\n",
              GetParam().c_str(), r.ppl(), want, (long long)r.scored);
  EXPECT_EQ(r.scored, recorded["scored"].get<int64_t>());
  EXPECT_NEAR(r.ppl(), want, 0.01 * want);
}

INSTANTIATE_TEST_SUITE_P(Models, DemoModel, ::testing::Values("main", "draft"));

}  // namespace
}  // namespace mere
