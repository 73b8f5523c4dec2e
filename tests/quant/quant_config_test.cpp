// config.json "quantization" parsing (quant/quant_config.h) and loading an affine
// weight in whatever form the checkpoint stores it (quant/load_weight.h): every
// inconsistency is an error that names the file and the field or tensor.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <functional>

#include "io/checkpoint.h"
#include "io/safetensors_writer.h"
#include "quant/affine_quantize.h"
#include "quant/load_weight.h"
#include "quant/quant_config.h"
#include "test_util.h"

namespace mere {
namespace {

using nlohmann::json;
using test::expect_error;

QuantizationConfig parse(const json& quantization) {
  json c = {{"model_type", "qwen3"}, {"quantization", quantization}};
  return QuantizationConfig::parse(ConfigJson::from_json(c, "/models/q/config.json"));
}

TEST(QuantConfig, ReadsDefaultsAndPerModuleOverrides) {
  QuantizationConfig q = parse({{"group_size", 64},
                                {"bits", 4},
                                {"mode", "affine"},
                                {"lm_head", false},
                                {"model.layers.0.mlp.down_proj", {{"group_size", 32}, {"bits", 8}}}});
  ASSERT_TRUE(q.affine.has_value());
  EXPECT_EQ(q.affine->bits, 4);
  EXPECT_EQ(q.affine->group_size, 64);
  EXPECT_FALSE(q.affine_for("lm_head").has_value());
  EXPECT_EQ(q.affine_for("model.layers.0.mlp.down_proj")->bits, 8);
  EXPECT_EQ(q.affine_for("model.layers.0.mlp.down_proj")->group_size, 32);
  EXPECT_EQ(q.affine_for("model.layers.1.mlp.down_proj")->bits, 4);
  EXPECT_TRUE(q.quantized());
  EXPECT_FALSE(QuantizationConfig::parse(ConfigJson::from_json({{"model_type", "qwen3"}}, "c.json")).quantized());
}

TEST(QuantConfig, BadBitsGroupSizeOrModeNameTheFileAndField) {
  expect_error([] { parse({{"group_size", 64}, {"bits", 3}}); },
               {"/models/q/config.json", "quantization.bits is 3", "4- and 8-bit"});
  expect_error([] { parse({{"group_size", 48}, {"bits", 4}}); },
               {"/models/q/config.json", "quantization.group_size is 48", "32, 64 or 128"});
  expect_error([] { parse({{"group_size", 64}, {"bits", 4}, {"model.layers.2.self_attn.q_proj", {{"group_size", 64}, {"bits", 2}}}}); },
               {"/models/q/config.json", "quantization.model.layers.2.self_attn.q_proj.bits is 2"});
  expect_error([] { parse({{"group_size", 32}, {"bits", 4}, {"mode", "mxfp4"}}); },
               {"/models/q/config.json", "quantization.mode is 'mxfp4'"});
  expect_error([] { parse({{"bits", 4}}); }, {"/models/q/config.json", "group_size"});
  json gptq = {{"model_type", "qwen3"}, {"quantization_config", {{"quant_method", "gptq"}, {"bits", 4}}}};
  expect_error([&] { QuantizationConfig::parse(ConfigJson::from_json(gptq, "/models/g/config.json")); },
               {"/models/g/config.json", "quantization_config.quant_method is 'gptq'"});
  json fp8_static = {{"model_type", "qwen3"},
                     {"quantization_config", {{"quant_method", "fp8"}, {"activation_scheme", "static"},
                                              {"weight_block_size", {128, 128}}}}};
  expect_error([&] { QuantizationConfig::parse(ConfigJson::from_json(fp8_static, "/models/f/config.json")); },
               {"/models/f/config.json", "quantization_config.activation_scheme is 'static'"});
  fp8_static["quantization_config"]["activation_scheme"] = "dynamic";
  EXPECT_EQ(QuantizationConfig::parse(ConfigJson::from_json(fp8_static, "/models/f/config.json")).fp8_block, 128);
}

// MLX writes its spec twice ("quantization" and "quantization_config", the same
// object); a pair that disagrees is an error naming both keys and what differs.
TEST(QuantConfig, QuantizationConfigBesideMlxsKeyMustAgreeWithIt) {
  auto both = [](const json& mlx, const json& twin) {
    json c = {{"model_type", "qwen3"}, {"quantization", mlx}, {"quantization_config", twin}};
    return QuantizationConfig::parse(ConfigJson::from_json(c, "/models/q/config.json"));
  };
  const json spec = {{"group_size", 64}, {"bits", 4}, {"lm_head", {{"group_size", 32}, {"bits", 8}}}};
  EXPECT_EQ(both(spec, spec).affine_for("lm_head")->bits, 8);
  // The same specs written otherwise: a module listed with the default spec, or as true.
  json listed = spec;
  listed["model.layers.0.mlp.down_proj"] = true;
  EXPECT_EQ(both(spec, listed).affine_for("model.layers.0.mlp.down_proj")->bits, 4);
  // A quantization_config of another method beside MLX's key is left to "quantization".
  EXPECT_EQ(both(spec, {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}).affine->bits, 4);

  expect_error([&] { both(spec, {{"group_size", 64}, {"bits", 8}, {"lm_head", {{"group_size", 32}, {"bits", 8}}}}); },
               {"/models/q/config.json", "quantization and quantization_config disagree on the default",
                "4-bit in groups of 64 against 8-bit in groups of 64"});
  expect_error([&] { both(spec, {{"group_size", 64}, {"bits", 4}}); },
               {"disagree on module lm_head", "8-bit in groups of 32 against 4-bit in groups of 64"});
  json dense = spec;
  dense["model.layers.1.mlp.up_proj"] = false;
  expect_error([&] { both(spec, dense); }, {"disagree on module model.layers.1.mlp.up_proj", "against left dense"});
  expect_error([&] { both(spec, {{"group_size", 64}, {"bits", 64}}); }, {"quantization_config.bits is 64"});
  expect_error([&] { both(spec, {{"group_size", 64}, {"bits", 4}, {"lm_head", 100}}); },
               {"quantization_config.lm_head must be an object or a boolean"});
  expect_error([&] { both(spec, 5); }, {"quantization_config", "expected an object"});
}

// A checkpoint directory with one affine module "m" of [8, 64] quantized int4 g32,
// with `edit` applied to its tensors first.
std::filesystem::path write_module(const std::string& name,
                                   const std::function<void(std::vector<NamedTensor>&)>& edit = {}) {
  std::vector<float> v;
  for (int i = 0; i < 8 * 64; ++i) v.push_back(float(i % 17) * 0.01f - 0.08f);
  AffineWeight a = quantize_affine(Tensor::from_floats(v, {8, 64}).to(DType::bf16), 4, 32, DType::bf16);
  std::vector<NamedTensor> tensors = {{"m.weight", a.packed}, {"m.scales", a.scales}, {"m.biases", a.biases}};
  if (edit) edit(tensors);
  auto dir = test::temp_dir(name);
  write_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

Weight load(const std::filesystem::path& dir, const json& quantization = {{"group_size", 32}, {"bits", 4}}) {
  QuantizationConfig q = quantization.is_null() ? QuantizationConfig{} : parse(quantization);
  return load_weight(Checkpoint::open(dir), "m", {8, 64}, "test shape", q);
}

TEST(LoadWeight, ReadsAnAffineModule) {
  Weight w = load(write_module("ok"));
  EXPECT_EQ(w.kind(), Weight::Kind::affine);
  EXPECT_EQ(w.describe(), "affine int4 g32");
  EXPECT_EQ(w.rows(), 8);
  EXPECT_EQ(w.cols(), 64);
}

TEST(LoadWeight, InconsistentTensorsNameTheFileAndTensor) {
  // Scales of the wrong shape.
  auto dir = write_module("scales", [](std::vector<NamedTensor>& t) { t[1].tensor = Tensor::zeros({8, 3}, DType::bf16); });
  expect_error([&] { load(dir); }, {"model.safetensors", "m.scales has shape [8, 3], expected [8, 2]", "group scales of m.weight"});
  // Biases missing.
  dir = write_module("biases", [](std::vector<NamedTensor>& t) { t.pop_back(); });
  expect_error([&] { load(dir); }, {"m.biases"});
  // Packed weight of the wrong width for the bits in config.json.
  dir = write_module("bits");
  expect_error([&] { load(dir, {{"group_size", 32}, {"bits", 8}}); },
               {"model.safetensors", "m.weight is u32 [8, 8], expected u32 [8, 16] for 8-bit weights of [8, 64]"});
  // Group size that does not match the scales.
  expect_error([&] { load(dir, {{"group_size", 64}, {"bits", 4}}); }, {"model.safetensors", "m.scales has shape [8, 2], expected [8, 1]"});
  // Scales in a checkpoint whose config.json does not quantize, or not this module.
  expect_error([&] { load(dir, nullptr); }, {"m.weight has group scales but config.json does not quantize m"});
  expect_error([&] { load(dir, {{"group_size", 32}, {"bits", 4}, {"m", false}}); },
               {"m.weight has group scales but config.json does not quantize m"});
  // A packed weight that is not u32.
  dir = write_module("dtype", [](std::vector<NamedTensor>& t) { t[0].tensor = Tensor::zeros({8, 8}, DType::i32); });
  expect_error([&] { load(dir); }, {"model.safetensors", "m.weight is i32 [8, 8], expected u32 [8, 8]"});
}

}  // namespace
}  // namespace mere
