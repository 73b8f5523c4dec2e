// The dense family against transformers: logits and greedy continuations of the
// tiny random-weight checkpoints made by scripts/make_fixtures.py.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "engine/generate.h"
#include "io/npy.h"
#include "models/blocks/rope_scaling.h"
#include "models/model.h"
#include "test_util.h"

namespace mere {
namespace {

class LlamaFixture : public ::testing::TestWithParam<std::string> {
 protected:
  std::filesystem::path dir() const { return test::fixtures_dir() / GetParam(); }
};

TEST_P(LlamaFixture, LogitsMatchTransformers) {
  auto ref = test::read_json(dir() / "reference.json");
  std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
  Tensor want = read_npy(dir() / "logits.npy");
  auto model = load_model(dir());
  auto state = model->make_state();
  Tensor got = model->forward(ids, *state, /*all_logits=*/true);
  ASSERT_EQ(got.shape(), want.shape());
  const float max_ref = test::max_abs(want);
  test::MaxDiff d = test::max_abs_diff(got, want);
  float relative = d.diff / max_ref;
  std::printf("[ fixture  ] %s: max |logit diff| %.3g at %lld, max |logit| %.3f, relative error %.3g\n",
              GetParam().c_str(), d.diff, (long long)d.index, max_ref, relative);
  EXPECT_LE(relative, 1e-4f);
}

TEST_P(LlamaFixture, IncrementalDecodeMatchesOneForward) {
  auto ref = test::read_json(dir() / "reference.json");
  std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
  Tensor want = read_npy(dir() / "logits.npy");
  auto model = load_model(dir());
  auto state = model->make_state();
  // Prefill half, then one token at a time: the KV cache must carry the rest.
  size_t half = ids.size() / 2;
  model->forward(std::vector<int32_t>(ids.begin(), ids.begin() + long(half)), *state, false);
  for (size_t t = half; t < ids.size(); ++t) {
    Tensor got = model->forward({ids[t]}, *state, false);
    Tensor row = want.slice_rows(int64_t(t), int64_t(t) + 1);
    EXPECT_LE(test::max_abs_diff(got, row).diff, 1e-4f * 4) << "position " << t;
  }
}

TEST_P(LlamaFixture, GreedyContinuationMatchesTransformers) {
  auto ref = test::read_json(dir() / "reference.json");
  std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
  std::vector<int32_t> want = ref["greedy"].get<std::vector<int32_t>>();
  auto model = load_model(dir());
  GenerateOptions options;
  options.max_new_tokens = int(want.size());
  options.sampling.temperature = 0;
  std::vector<int32_t> got;
  GenerateStats stats = generate(*model, ids, options, [&](int32_t id) {
    got.push_back(id);
    return true;
  });
  EXPECT_EQ(got, want);
  EXPECT_EQ(stats.stop_reason, "length");
}

INSTANTIATE_TEST_SUITE_P(Families, LlamaFixture, ::testing::Values("llama", "qwen2", "qwen3"));

TEST(RopeScaling, MatchesTransformersForEveryType) {
  auto ref = test::read_json(test::fixtures_dir() / "rope_reference.json");
  int n = 0;
  for (const auto& c : ref["cases"]) {
    ConfigJson config = ConfigJson::from_json(c["config"], "rope_reference.json");
    int head_dim = config.get<int>("head_dim", config.require<int>("hidden_size") / config.require<int>("num_attention_heads"));
    ops::RopeTable table = rope_table_from_config(config, head_dim);
    auto want = c["inv_freq"].get<std::vector<float>>();
    std::string label = c["config"]["rope_parameters"].dump();
    ASSERT_EQ(table.inv_freq.size(), want.size()) << label;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(table.inv_freq[i], want[i], 2e-6f * want[i]) << label << " dim " << i;
    EXPECT_NEAR(table.attention_factor, c["attention_factor"].get<float>(), 1e-6f) << label;
    ++n;
  }
  EXPECT_GE(n, 10);
}

}  // namespace
}  // namespace mere
