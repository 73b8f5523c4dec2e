// The published shapes of `mere bench --shape` (models/shapes.cpp): each one's
// parameter count, summed over the tensors its config asks for (no weights
// made), matches its model card, so a mistyped size cannot pass for the model;
// an unknown name is an error that lists the known ones.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "io/config.h"
#include "models/llama.h"
#include "models/qwen3_moe.h"
#include "models/shapes.h"
#include "test_util.h"

namespace mere {
namespace {

struct Counts {
  double total = 0, non_embedding = 0;  // parameters
};

Counts count_parameters(const std::string& name) {
  const nlohmann::json json = shape_config(name);
  const ConfigJson config = ConfigJson::from_json(json, name + "/config.json");
  const auto shapes = json["model_type"] == "qwen3_moe" ? Qwen3MoeConfig::parse(config).tensor_shapes()
                                                         : LlamaConfig::parse(config).tensor_shapes();
  Counts c;
  for (const auto& [tensor, shape] : shapes) {
    double n = 1;
    for (int64_t d : shape) n *= double(d);
    c.total += n;
    if (tensor != "model.embed_tokens.weight" && tensor != "lm_head.weight") c.non_embedding += n;
  }
  return c;
}

// Model cards (Hugging Face): the Qwen3 cards' "Number of Parameters" and
// "Non-Embedding"; Meta-Llama-3-8B 8.03B, of which 1.05B are its untied
// embedding and head. The cards round to two or three digits.
TEST(Shapes, ParameterCountsMatchTheModelCards) {
  struct Card {
    std::string name;
    double total_b, non_embedding_b;
  };
  for (const Card& card : {Card{"llama3-8b", 8.03, 6.98}, Card{"qwen3-8b", 8.2, 6.95}, Card{"qwen3-4b", 4.0, 3.6},
                           Card{"qwen3-0.6b", 0.6, 0.44}, Card{"qwen3-30b-a3b", 30.5, 29.9}}) {
    const Counts c = count_parameters(card.name);
    EXPECT_NEAR(c.total / 1e9, card.total_b, 0.02 * card.total_b) << card.name;
    EXPECT_NEAR(c.non_embedding / 1e9, card.non_embedding_b, 0.02 * card.non_embedding_b) << card.name;
  }
}

TEST(Shapes, EveryKnownShapeIsCountedAndAnUnknownOneListsThem) {
  for (const std::string& name : known_shapes()) EXPECT_GT(count_parameters(name).total, 1e8) << name;
  try {
    shape_config("qwen3-5b");
    FAIL() << "an unknown shape was accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("qwen3-5b"), std::string::npos) << message;
    for (const std::string& name : known_shapes()) EXPECT_NE(message.find(name), std::string::npos) << message;
  }
}

// Overrides replace the published config's fields: a Qwen3-MoE shape cut to two
// small layers, the first dense, builds (on the CPU) with those layers.
TEST(Shapes, RandomModelTakesConfigOverrides) {
  const nlohmann::json overrides = {{"num_hidden_layers", 2}, {"mlp_only_layers", {0}}, {"hidden_size", 64},
                                    {"intermediate_size", 96}, {"moe_intermediate_size", 32},
                                    {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
                                    {"num_experts", 4}, {"num_experts_per_tok", 2}, {"vocab_size", 128}};
  const auto model = random_model("qwen3-30b-a3b", Device::cpu, {}, 1, {}, overrides);
  EXPECT_EQ(model->kv_layout().n_layers, 2);
  EXPECT_EQ(model->info().vocab, 128);
  const auto& moe = dynamic_cast<const Qwen3Moe&>(*model);
  EXPECT_FALSE(moe.config().sparse(0));
  EXPECT_TRUE(moe.config().sparse(1));
  auto state = model->make_state(8);
  EXPECT_EQ(model->forward({1, 2, 3}, *state, false).dim(1), 128);
}

// A Llama shape with mlp_bias (read for model_type llama only): the MLP's biases
// are among its tensors and the loader reads them all (a tensor left unused
// would be an error), fused or not.
TEST(Shapes, DenseShapeWithMlpBiasLoadsItsBiases) {
  const nlohmann::json overrides = {{"num_hidden_layers", 2}, {"hidden_size", 64},      {"intermediate_size", 96},
                                    {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
                                    {"vocab_size", 128},        {"mlp_bias", true}};
  for (bool fuse : {false, true}) {
    const auto model = random_model("llama3-8b", Device::cpu, {.fuse_projections = fuse}, 1, {}, overrides);
    const auto& llama = dynamic_cast<const Llama&>(*model);
    EXPECT_TRUE(llama.config().mlp_bias);
    auto state = model->make_state(8);
    const Tensor logits = model->forward({1, 2, 3}, *state, false);
    ASSERT_EQ(logits.dim(1), 128);
    for (int64_t i = 0; i < logits.numel(); ++i) ASSERT_TRUE(std::isfinite(logits.at(i))) << i;
  }
}

// MLX stores an fp16 model's scales and biases as f16: `--scale-dtype f16` makes
// them so (another dtype, or f16 for weights without affine scales, is an error).
// The same draws in f16 instead of bf16 give logits within bf16's rounding of
// the bf16-scaled model's, not identical to them.
TEST(Shapes, AffineShapesTakeF16Scales) {
  EXPECT_EQ(RandomQuant::parse("int4", 64, "f16").describe(), "int4 g64 f16 scales");
  EXPECT_EQ(RandomQuant::parse("int8", 32).describe(), "int8 g32");
  try {
    RandomQuant::parse("int4", 64, "f32");
    ADD_FAILURE() << "f32 scales accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--scale-dtype 'f32'"), std::string::npos) << e.what();
  }
  try {
    RandomQuant::parse("fp8", 64, "f16");  // FP8 block scales are f32; bf16 weights have none
    ADD_FAILURE() << "f16 scales accepted for fp8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--scale-dtype f16: applies to --quant int8 or int4"), std::string::npos)
        << e.what();
  }
  const nlohmann::json overrides = {{"num_hidden_layers", 2}, {"hidden_size", 128},      {"intermediate_size", 256},
                                    {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 32},
                                    {"vocab_size", 128}};
  Tensor logits[2];
  for (int f16 : {0, 1}) {
    const auto model = random_model("llama3-8b", Device::cpu, {}, 1,
                                    RandomQuant::parse("int4", 64, f16 ? "f16" : "bf16"), overrides);
    auto state = model->make_state(8);
    logits[f16] = model->forward({1, 2, 3}, *state, false);
  }
  const float diff = test::max_abs_diff(logits[0], logits[1]).diff;
  EXPECT_GT(diff, 0.0f) << "the f16 scales were not used";
  EXPECT_LE(diff, 2e-2f * test::max_abs(logits[0])) << "f16 vs bf16 scales";
}

}  // namespace
}  // namespace mere
