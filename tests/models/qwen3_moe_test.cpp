// The Qwen3-MoE family against transformers: logits and greedy continuations of
// the tiny random-weight checkpoints made by scripts/make_moe_fixtures.py, one
// per expert layout (per-expert modules, transformers 5's packed tensors, and
// mlx-lm's int4 stacks), with dense and sparse layers mixed.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "engine/generate.h"
#include "io/npy.h"
#include "io/safetensors_writer.h"
#include "models/model.h"
#include "models/qwen3_moe.h"
#include "test_util.h"

namespace mere {
namespace {

class Qwen3MoeFixture : public ::testing::TestWithParam<std::string> {
 protected:
  std::filesystem::path dir() const { return test::fixtures_dir() / GetParam(); }
};

TEST_P(Qwen3MoeFixture, LogitsMatchTransformers) {
  auto ref = test::read_json(dir() / "reference.json");
  std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
  Tensor want = read_npy(dir() / "logits.npy");
  for (bool fused : {false, true}) {
    auto model = load_model(dir(), Device::cpu, LoadOptions{.fuse_moe_gate_up = fused});
    EXPECT_EQ(model->info().family, "qwen3_moe");
    auto state = model->make_state();
    Tensor got = model->forward(ids, *state, /*all_logits=*/true);
    ASSERT_EQ(got.shape(), want.shape());
    test::MaxDiff d = test::max_abs_diff(got, want);
    const float relative = d.diff / test::max_abs(want);
    std::printf("[ fixture  ] %s%s: max |logit diff| %.3g, relative %.3g\n", GetParam().c_str(),
                fused ? " (fused gate/up)" : "", d.diff, relative);
    EXPECT_LE(relative, 1e-4f);
  }
}

TEST_P(Qwen3MoeFixture, IncrementalDecodeMatchesOneForward) {
  auto ref = test::read_json(dir() / "reference.json");
  std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
  Tensor want = read_npy(dir() / "logits.npy");
  auto model = load_model(dir());
  auto state = model->make_state();
  const size_t half = ids.size() / 2;
  model->forward(std::vector<int32_t>(ids.begin(), ids.begin() + long(half)), *state, false);
  for (size_t t = half; t < ids.size(); ++t) {
    Tensor got = model->forward({ids[t]}, *state, false);
    EXPECT_LE(test::max_abs_diff(got, want.slice_rows(int64_t(t), int64_t(t) + 1)).diff, 4e-4f * test::max_abs(want))
        << "position " << t;
  }
}

TEST_P(Qwen3MoeFixture, GreedyContinuationMatchesTransformers) {
  auto ref = test::read_json(dir() / "reference.json");
  std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
  std::vector<int32_t> want = ref["greedy"].get<std::vector<int32_t>>();
  auto model = load_model(dir());
  GenerateOptions options;
  options.max_new_tokens = int(want.size());
  options.sampling.temperature = 0;
  std::vector<int32_t> got;
  generate(*model, ids, options, [&](int32_t id) {
    got.push_back(id);
    return true;
  });
  EXPECT_EQ(got, want);
}

INSTANTIATE_TEST_SUITE_P(Layouts, Qwen3MoeFixture,
                         ::testing::Values("qwen3_moe", "qwen3_moe-step2", "qwen3_moe-mlx4"));

TEST(Qwen3MoeConfig, SparseLayersFollowStepAndMlpOnlyLayers) {
  const auto base = test::read_json(test::fixtures_dir() / "qwen3_moe" / "config.json");
  auto parse = [&](nlohmann::json patch) {
    nlohmann::json j = base;
    j.merge_patch(patch);
    return Qwen3MoeConfig::parse(ConfigJson::from_json(j, "patched/config.json"));
  };
  Qwen3MoeConfig every = parse({{"decoder_sparse_step", 1}, {"mlp_only_layers", nlohmann::json::array()}});
  Qwen3MoeConfig second = parse({{"decoder_sparse_step", 2}, {"mlp_only_layers", {3}}});
  for (int l = 0; l < 4; ++l) {
    EXPECT_TRUE(every.sparse(l)) << l;
    EXPECT_EQ(second.sparse(l), l == 1) << l;  // (l + 1) % 2 == 0 gives 1 and 3; 3 is dense by mlp_only_layers
  }
  EXPECT_EQ(parse(nlohmann::json::object()).n_experts, 8);  // transformers 5 writes num_local_experts
  EXPECT_EQ(parse({{"num_experts", 16}, {"num_experts_per_tok", 3}}).n_experts, 16);  // published configs: num_experts
  EXPECT_FALSE(parse({{"num_experts", 0}}).sparse(0));  // no experts: every layer dense
  test::expect_error([&] { parse({{"num_experts_per_tok", 9}}); }, {"patched/config.json", "num_experts_per_tok 9"});
  test::expect_error([&] { parse({{"moe_intermediate_size", 0}}); }, {"moe_intermediate_size"});
}

TEST(Qwen3MoeLoading, MissingExpertIsNamed) {
  const auto src = test::fixtures_dir() / "qwen3_moe";
  const auto dir = test::temp_dir("moe_missing_expert");
  std::filesystem::copy(src / "config.json", dir / "config.json");
  std::vector<NamedTensor> tensors;
  Checkpoint full = Checkpoint::open(src);
  for (const std::string& name : full.names())
    if (name != "model.layers.2.mlp.experts.5.up_proj.weight") tensors.push_back({name, full.get(name).clone()});
  write_safetensors(dir / "model.safetensors", tensors);
  test::expect_error([&] { load_model(dir); }, {"model.layers.2.mlp.experts.5.up_proj.weight"});
}

}  // namespace
}  // namespace mere
