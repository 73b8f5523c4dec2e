// MLX-format checkpoints made independently of mere (scripts/make_quant_fixtures.py:
// a numpy affine quantizer, transformers on the dequantized weights): they load
// with their weights quantized, their logits and greedy tokens match transformers,
// and our quantizer reproduces the numpy one bit for bit on the same dense weights.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>

#include "engine/generate.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/npy.h"
#include "models/model.h"
#include "quant/affine_quantize.h"
#include "quant/quant_config.h"
#include "test_util.h"

namespace mere {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class MlxFixture : public ::testing::TestWithParam<std::string> {
 protected:
  fs::path dir() const { return test::fixtures_dir() / GetParam(); }
  json reference() const { return json::parse(test::read_file(dir() / "reference.json")); }
};

TEST_P(MlxFixture, LogitsAndGreedyMatchTransformersOnTheDequantizedWeights) {
  const json ref = reference();
  const std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
  Tensor want = read_npy(dir() / "logits.npy");
  auto model = load_model(dir());
  // The packed weights are what the model holds: 4 or 8 bits a weight, not bf16 or f32.
  Checkpoint checkpoint = Checkpoint::open(dir());
  EXPECT_EQ(checkpoint.info("model.layers.0.mlp.up_proj.weight").dtype, DType::u32);

  auto state = model->make_state();
  Tensor got = model->forward(ids, *state, /*all_logits=*/true);
  ASSERT_EQ(got.shape(), want.shape());
  const float max_ref = test::max_abs(want);
  test::MaxDiff d = test::max_abs_diff(got, want);
  std::printf("[ fixture  ] %s (int%d g%d): max |logit diff| %.3g at %lld, max |logit| %.3f, relative error %.3g\n",
              GetParam().c_str(), ref["bits"].get<int>(), ref["group_size"].get<int>(), d.diff, (long long)d.index,
              max_ref, d.diff / max_ref);
  EXPECT_LE(d.diff / max_ref, 1e-4f);

  GenerateOptions options;
  options.max_new_tokens = int(ref["greedy"].size());
  options.sampling.temperature = 0;
  std::vector<int32_t> tokens;
  generate(*model, ids, options, [&](int32_t id) {
    tokens.push_back(id);
    return true;
  });
  EXPECT_EQ(tokens, ref["greedy"].get<std::vector<int32_t>>());
}

TEST_P(MlxFixture, OurQuantizerReproducesTheReferenceBitForBit) {
  const json ref = reference();
  // Each module at its own bits and group size (config.json's overrides).
  const QuantizationConfig quant = QuantizationConfig::parse(ConfigJson::load(dir() / "config.json"));
  Checkpoint mlx = Checkpoint::open(dir());
  Checkpoint dense = Checkpoint::open(test::fixtures_dir() / ref["source"].get<std::string>());
  int modules = 0;
  for (const std::string& name : mlx.names()) {
    if (!name.ends_with(".scales")) continue;
    const std::string module = name.substr(0, name.size() - 7);
    Tensor w = dense.get(module + ".weight");
    const std::optional<AffineSpec> spec = quant.affine_for(module);
    ASSERT_TRUE(spec.has_value()) << module;
    AffineWeight ours = quantize_affine(w, spec->bits, spec->group_size, w.dtype());
    for (const char* part : {".weight", ".scales", ".biases"}) {
      Tensor theirs = mlx.get(module + part);
      const Tensor& mine = std::string(part) == ".weight" ? ours.packed : std::string(part) == ".scales" ? ours.scales : ours.biases;
      ASSERT_EQ(mine.dtype(), theirs.dtype()) << module << part;
      ASSERT_EQ(mine.shape(), theirs.shape()) << module << part;
      const size_t elem = dtype_size(mine.dtype());
      int64_t first = -1, differ = 0;
      for (int64_t i = 0; i < mine.numel(); ++i)
        if (std::memcmp(static_cast<const char*>(mine.raw()) + i * elem, static_cast<const char*>(theirs.raw()) + i * elem,
                        elem) != 0) {
          if (first < 0) first = i;
          ++differ;
        }
      EXPECT_EQ(differ, 0) << module << part << ": " << differ << " of " << mine.numel() << " elements differ, first at "
                           << first;
    }
    ++modules;
  }
  EXPECT_EQ(modules, ref["quantized_modules"].get<int>());
  // The tensors left dense are the source's, byte for byte.
  for (const std::string& name : dense.names()) {
    if (name.ends_with(".weight") && mlx.has(name.substr(0, name.size() - 7) + ".scales")) continue;
    Tensor a = dense.get(name), b = mlx.get(name);
    ASSERT_EQ(a.shape(), b.shape()) << name;
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.size_bytes()), 0) << name;
  }
}

// qwen2-mlx4: f16, q/k/v biases, and a tied embedding quantized at 8 bits in
// groups of 32 (a per-module override) that is also lm_head; the rest int4 g64.
INSTANTIATE_TEST_SUITE_P(Fixtures, MlxFixture, ::testing::Values("qwen3-mlx4", "llama-mlx8", "qwen2-mlx4"));

}  // namespace
}  // namespace mere
