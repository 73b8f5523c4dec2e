// mere quantize end to end: an MLX-layout checkpoint that loads, --keep, and the
// errors for bad input.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "io/safetensors.h"
#include "models/model.h"
#include "test_util.h"

namespace mere {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path demo_dir() { return test::source_dir() / "models" / "demo"; }

json read_json(const fs::path& p) { return json::parse(test::read_file(p)); }

void expect_loads_and_runs(const fs::path& dir) {
  auto model = load_model(dir);
  auto state = model->make_state();
  Tensor logits = model->forward({1, 2, 3, 4}, *state, /*all_logits=*/false);
  ASSERT_EQ(logits.dim(1), model->info().vocab);
  for (int64_t i = 0; i < logits.numel(); ++i) ASSERT_TRUE(std::isfinite(logits.at(i))) << i;
}

TEST(QuantizeCmd, DemoModelInt8InMlxLayout) {
  const fs::path out = test::temp_dir("q") / "demo-8bit";
  auto r = test::run_mere("quantize -m " + demo_dir().string() + " -o " + out.string() + " --bits 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("quantize int8 g64"), std::string::npos) << r.err;  // the progress bar
  EXPECT_NE(r.out.find("quantized 43 of 68 tensors"), std::string::npos) << r.out;

  const json config = read_json(out / "config.json"), source = read_json(demo_dir() / "config.json");
  EXPECT_EQ(config["quantization"], json({{"group_size", 64}, {"bits", 8}}));
  EXPECT_EQ(config["quantization_config"], config["quantization"]);
  for (const auto& [key, value] : source.items()) EXPECT_EQ(config[key], value) << key;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "heldout_test.txt"})
    EXPECT_EQ(test::read_file(out / f), test::read_file(demo_dir() / f)) << f;
  EXPECT_FALSE(fs::exists(out / "draft"));  // subdirectories are not part of the checkpoint

  // mlx-lm's names and dtypes: packed u32 weight, scales and biases in the model dtype.
  SafetensorsFile st = SafetensorsFile::open(out / "model.safetensors");
  EXPECT_EQ(st.metadata().at("format"), "mlx");
  auto expect = [&](const std::string& name, DType dt, Shape shape) {
    const SafetensorsEntry* e = st.find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->dtype, dt) << name;
    EXPECT_EQ(e->shape, shape) << name;
  };
  expect("model.embed_tokens.weight", DType::u32, {8192, 96});
  expect("model.embed_tokens.scales", DType::bf16, {8192, 6});
  expect("model.embed_tokens.biases", DType::bf16, {8192, 6});
  expect("model.layers.0.self_attn.q_proj.weight", DType::u32, {384, 96});
  expect("model.layers.5.mlp.down_proj.weight", DType::u32, {384, 256});
  expect("model.layers.5.mlp.down_proj.scales", DType::bf16, {384, 16});
  expect("model.layers.0.input_layernorm.weight", DType::bf16, {384});
  expect("model.layers.0.self_attn.q_norm.weight", DType::bf16, {64});
  expect("model.norm.weight", DType::bf16, {384});
  EXPECT_FALSE(st.has("lm_head.weight"));  // tied to embed_tokens, as in the source
  EXPECT_EQ(st.entries().size(), 68u + 2 * 43);
  expect_loads_and_runs(out);

  // Its own output is already quantized: refused, and nothing is written.
  const fs::path again = out.parent_path() / "again";
  r = test::run_mere("quantize -m " + out.string() + " -o " + again.string() + " --bits 4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("already quantized"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("config.json"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(again));
}

TEST(QuantizeCmd, KeepLeavesMatchingModulesDense) {
  const fs::path out = test::temp_dir("q") / "llama-4bit";
  auto r = test::run_mere("quantize -m " + (test::fixtures_dir() / "llama").string() + " -o " + out.string() +
                          " --bits 4 --group-size 32 --keep lm_head --keep 'layers\\.1\\.mlp\\.down'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json q = read_json(out / "config.json")["quantization"];
  EXPECT_EQ(q, json({{"group_size", 32}, {"bits", 4}, {"lm_head", false}, {"model.layers.1.mlp.down_proj", false}}))
      << q.dump();
  SafetensorsFile st = SafetensorsFile::open(out / "model.safetensors");
  EXPECT_EQ(st.find("lm_head.weight")->dtype, DType::bf16);
  EXPECT_EQ(st.find("lm_head.weight")->shape, (Shape{512, 64}));
  EXPECT_FALSE(st.has("lm_head.scales"));
  EXPECT_FALSE(st.has("model.layers.1.mlp.down_proj.scales"));
  EXPECT_EQ(st.find("model.layers.0.mlp.down_proj.weight")->dtype, DType::u32);
  EXPECT_EQ(st.find("model.layers.0.mlp.down_proj.weight")->shape, (Shape{64, 20}));  // 160 columns, 8 per word
  EXPECT_EQ(st.find("model.embed_tokens.weight")->dtype, DType::u32);
  expect_loads_and_runs(out);
}

// --format fp8: the Qwen3-FP8 / DeepSeek-V3 layout (E4M3 weights, f32
// weight_scale_inv per 128x128 block, quantization_config fp8), embeddings
// left dense; it loads as an FP8 checkpoint and its logits stay near the
// dense model's.
TEST(QuantizeCmd, Fp8InTheQwen3Fp8Layout) {
  const fs::path src = test::fixtures_dir() / "llama", out = test::temp_dir("q") / "llama-fp8";
  auto r = test::run_mere("quantize -m " + src.string() + " -o " + out.string() + " --format fp8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("quantize fp8 e4m3 128x128"), std::string::npos) << r.err;  // the progress bar
  EXPECT_NE(r.err.find("keeping model.embed_tokens dense (an embedding)"), std::string::npos) << r.err;
  const json config = read_json(out / "config.json");
  EXPECT_FALSE(config.contains("quantization"));
  EXPECT_EQ(config["quantization_config"], json({{"quant_method", "fp8"},
                                                 {"fmt", "e4m3"},
                                                 {"activation_scheme", "dynamic"},
                                                 {"weight_block_size", {128, 128}}}));
  SafetensorsFile st = SafetensorsFile::open(out / "model.safetensors");
  EXPECT_EQ(st.find("model.layers.0.mlp.down_proj.weight")->dtype, DType::f8_e4m3);
  EXPECT_EQ(st.find("model.layers.0.mlp.down_proj.weight")->shape, (Shape{64, 160}));
  EXPECT_EQ(st.find("model.layers.0.mlp.down_proj.weight_scale_inv")->dtype, DType::f32);
  EXPECT_EQ(st.find("model.layers.0.mlp.down_proj.weight_scale_inv")->shape, (Shape{1, 2}));
  EXPECT_EQ(st.find("lm_head.weight")->dtype, DType::f8_e4m3);
  EXPECT_EQ(st.find("model.embed_tokens.weight")->dtype, DType::bf16);
  EXPECT_FALSE(st.has("model.embed_tokens.weight_scale_inv"));

  auto dense = load_model(src), fp8 = load_model(out);
  auto s1 = dense->make_state(), s2 = fp8->make_state();
  const Tensor a = dense->forward({1, 2, 3, 4, 5}, *s1, /*all_logits=*/true);
  const Tensor b = fp8->forward({1, 2, 3, 4, 5}, *s2, /*all_logits=*/true);
  float top = 0, diff = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    top = std::max(top, std::fabs(a.at(i)));
    diff = std::max(diff, std::fabs(a.at(i) - b.at(i)));
  }
  EXPECT_GT(diff, 0.0f);             // the weights did change
  EXPECT_LE(diff, 0.1f * top);       // E4M3 keeps 3 mantissa bits: a few percent on this tiny model
  expect_loads_and_runs(out);

  // --bits and --group-size belong to the affine format.
  r = test::run_mere("quantize -m " + src.string() + " -o " + (out.string() + "-2") + " --format fp8 --bits 8");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--bits and --group-size are affine options"), std::string::npos) << r.err;
  r = test::run_mere("quantize -m " + src.string() + " -o " + (out.string() + "-3"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--bits is required"), std::string::npos) << r.err;
}

TEST(QuantizeCmd, BadInputIsAClearErrorAndWritesNothing) {
  const fs::path dir = test::temp_dir("bad");
  const std::string demo = demo_dir().string(), out = (dir / "out").string();
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {"-m " + demo + " -o " + out + " --bits 3", "--bits 3: mere writes 4- or 8-bit"},
           {"-m " + demo + " -o " + out + " --bits 4 --group-size 48", "--group-size 48"},
           {"-m " + demo + " -o " + out + " --bits 4 --keep '('", "--keep '('"},
           {"-m " + dir.string() + " -o " + out + " --bits 4", "no config.json"},
           {"-m /nonexistent/model -o " + out + " --bits 4", "/nonexistent/model"},
       }) {
    auto r = test::run_mere("quantize " + c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
  // An output directory that holds something.
  fs::create_directories(out);
  test::write_file(fs::path(out) / "keep.txt", "mine");
  auto r = test::run_mere("quantize -m " + demo + " -o " + out + " --bits 4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(out + ": exists and is not empty"), std::string::npos) << r.err;
  EXPECT_EQ(test::read_file(fs::path(out) / "keep.txt"), "mine");
}

}  // namespace
}  // namespace mere
