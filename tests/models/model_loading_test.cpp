// Strict loading: a config or checkpoint that does not fit the family is a clear
// error naming the file, field or tensor.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "models/model.h"
#include "ops/ops.h"
#include "test_util.h"

namespace mere {
namespace {

// A copy of a fixture with config.json edited by `edit`.
std::filesystem::path edited_fixture(const std::string& family, const std::function<void(nlohmann::json&)>& edit) {
  auto dir = test::temp_dir(family);
  for (const auto& e : std::filesystem::directory_iterator(test::fixtures_dir() / family))
    std::filesystem::copy(e.path(), dir / e.path().filename());
  nlohmann::json config = nlohmann::json::parse(test::read_file(dir / "config.json"));
  edit(config);
  test::write_file(dir / "config.json", config.dump(2));
  return dir;
}

std::string load_error(const std::filesystem::path& dir) {
  try {
    load_model(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ModelLoading, UnknownModelTypeListsSupported) {
  auto msg = load_error(edited_fixture("qwen3", [](auto& c) { c["model_type"] = "gpt2"; }));
  EXPECT_NE(msg.find("model_type 'gpt2' is not supported"), std::string::npos) << msg;
  EXPECT_NE(msg.find("llama, qwen2, qwen3"), std::string::npos) << msg;
}

TEST(ModelLoading, WrongShapeNamesTensorAndConfigField) {
  auto msg = load_error(edited_fixture("qwen3", [](auto& c) { c["intermediate_size"] = 100; }));
  EXPECT_NE(msg.find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("intermediate_size"), std::string::npos) << msg;
}

TEST(ModelLoading, MissingLayerIsAnError) {
  auto msg = load_error(edited_fixture("llama", [](auto& c) { c["num_hidden_layers"] = 3; }));
  EXPECT_NE(msg.find("missing tensor model.layers.2."), std::string::npos) << msg;
}

TEST(ModelLoading, UnusedTensorsAreAnError) {
  auto msg = load_error(edited_fixture("llama", [](auto& c) { c["num_hidden_layers"] = 1; }));
  EXPECT_NE(msg.find("does not use"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.layers.1."), std::string::npos) << msg;
}

TEST(ModelLoading, UnsupportedActivationAndRopeAreRefused) {
  auto msg = load_error(edited_fixture("qwen2", [](auto& c) { c["hidden_act"] = "gelu"; }));
  EXPECT_NE(msg.find("hidden_act"), std::string::npos) << msg;
  msg = load_error(edited_fixture("qwen2", [](auto& c) { c["rope_parameters"]["rope_type"] = "longrope"; }));
  EXPECT_NE(msg.find("rope type 'longrope' is not supported"), std::string::npos) << msg;
}

// Values that made NaN logits, decoded quietly into garbage (greedy text that stopped
// at once), or escaped as a JSON library error without the file's name.
TEST(ModelLoading, ConfigValuesThatWouldMakeNanAreRefused) {
  auto msg = load_error(edited_fixture("llama", [](auto& c) { c["rms_norm_eps"] = -1; }));
  EXPECT_NE(msg.find("config.json: rms_norm_eps -1 must be zero or more"), std::string::npos) << msg;
  msg = load_error(edited_fixture("llama", [](auto& c) { c["rope_theta"] = 0; }));
  EXPECT_NE(msg.find("config.json: RoPE's rope_theta 0 must be positive"), std::string::npos) << msg;
  msg = load_error(edited_fixture("qwen2", [](auto& c) {
    c["rope_parameters"]["rope_type"] = "linear";
    c["rope_parameters"]["factor"] = 0;
  }));
  EXPECT_NE(msg.find("RoPE's factor 0 must be positive"), std::string::npos) << msg;
  msg = load_error(edited_fixture("llama", [](auto& c) {
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 1.0}, {"original_max_position_embeddings", 8192}};
  }));
  EXPECT_NE(msg.find("high_freq_factor and low_freq_factor are both 1"), std::string::npos) << msg;
  msg = load_error(edited_fixture("llama", [](auto& c) {
    c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", -4.0}, {"original_max_position_embeddings", 64}};
  }));
  EXPECT_NE(msg.find("RoPE's factor -4 must be positive"), std::string::npos) << msg;
  msg = load_error(edited_fixture("qwen3_moe", [](auto& c) { c["mlp_only_layers"] = "x"; }));
  EXPECT_NE(msg.find("config.json: field 'mlp_only_layers' is a string"), std::string::npos) << msg;
}

TEST(ModelLoading, MissingConfigFieldIsNamed) {
  auto msg = load_error(edited_fixture("qwen3", [](auto& c) { c.erase("hidden_size"); }));
  EXPECT_NE(msg.find("hidden_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
}

// Lever fused_norm_matvec's decision at load: `on` folds every step of up to
// ops::kMaxFusedRows rows, `off` none; auto asks each fused-form matrix, and a
// CPU weight (or no matrix at all) never takes the tensor cores, so it folds
// nothing (the GPU's decisions: LlamaShapesGpu.FoldingFollowsTheStepsRowsOnDenseShapes).
// Steps past kMaxFusedRows rows never fold.
TEST(ModelInfo, FoldingDecisionFollowsTheModeAndTheMatrices) {
  const Weight cpu_weight(Tensor::empty({256, 512}, DType::bf16));
  const std::vector<const Weight*> fused{&cpu_weight};
  for (LeverMode mode : {LeverMode::on, LeverMode::off, LeverMode::automatic}) {
    for (const std::vector<const Weight*>& weights : {fused, std::vector<const Weight*>{}}) {
      ModelInfo info;
      info.decide_folding(mode, LoadOptions{.tensor_core_affine_matvec = true}, weights);
      for (int64_t T = 1; T <= ops::kMaxFusedRows; ++T)
        EXPECT_EQ(info.folds_step(T), mode == LeverMode::on) << lever_mode_name(mode) << ", " << T << " rows";
      EXPECT_FALSE(info.folds_step(ops::kMaxFusedRows + 1)) << lever_mode_name(mode);
    }
  }
}

}  // namespace
}  // namespace mere
