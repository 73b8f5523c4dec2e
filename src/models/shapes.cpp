#include "models/shapes.h"

#include <fmt/ranges.h>

#include <cmath>

#include "io/checkpoint.h"
#include "io/config.h"
#include "models/llama.h"

namespace mere {
namespace {

// The fields of the published config.json files that the forward pass reads.
nlohmann::json published(const std::string& name) {
  using nlohmann::json;
  if (name == "llama3-8b")  // meta-llama/Meta-Llama-3-8B
    return json{{"model_type", "llama"}, {"hidden_size", 4096}, {"intermediate_size", 14336},
                {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
                {"vocab_size", 128256}, {"max_position_embeddings", 8192}, {"rms_norm_eps", 1e-5},
                {"rope_theta", 500000.0}, {"tie_word_embeddings", false}, {"hidden_act", "silu"}};
  if (name == "qwen3-8b")  // Qwen/Qwen3-8B
    return json{{"model_type", "qwen3"}, {"hidden_size", 4096}, {"intermediate_size", 12288},
                {"num_hidden_layers", 36}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
                {"head_dim", 128}, {"vocab_size", 151936}, {"max_position_embeddings", 40960},
                {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0}, {"tie_word_embeddings", false},
                {"hidden_act", "silu"}};
  if (name == "qwen3-0.6b")  // Qwen/Qwen3-0.6B
    return json{{"model_type", "qwen3"}, {"hidden_size", 1024}, {"intermediate_size", 3072},
                {"num_hidden_layers", 28}, {"num_attention_heads", 16}, {"num_key_value_heads", 8},
                {"head_dim", 128}, {"vocab_size", 151936}, {"max_position_embeddings", 40960},
                {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0}, {"tie_word_embeddings", true},
                {"hidden_act", "silu"}};
  if (name == "qwen3-30b-a3b")
    fail("--shape qwen3-30b-a3b: refused: the qwen3_moe family is not implemented yet (sparse MoE, issue 8)");
  fail("unknown --shape '{}' (known: {})", name, fmt::join(known_shapes(), ", "));
}

}  // namespace

std::vector<std::string> known_shapes() { return {"llama3-8b", "qwen3-8b", "qwen3-0.6b", "qwen3-30b-a3b"}; }

nlohmann::json shape_config(const std::string& name) { return published(name); }

std::unique_ptr<Model> random_model(const std::string& name, Device device, const LoadOptions& options,
                                    uint64_t seed) {
  ConfigJson config = ConfigJson::from_json(published(name), name + "/config.json");
  LlamaConfig cfg = LlamaConfig::parse(config);
  std::map<std::string, Tensor> tensors;
  uint64_t i = 0;
  for (const auto& [tensor_name, shape] : cfg.tensor_shapes()) {
    Tensor t = Tensor::empty(shape, DType::bf16, device);
    // Norm weights near 1; matrices scaled like a trained model's so activations stay O(1).
    bool is_norm = shape.size() == 1;
    float scale = is_norm ? 0.1f : std::sqrt(3.0f / float(shape.back()));
    ops::fill_random(t, seed * 1000003 + i++, scale, is_norm ? 1.0f : 0.0f);
    tensors.emplace(tensor_name, t);
  }
  auto model = std::make_unique<Llama>(config, Checkpoint::from_tensors(name, std::move(tensors)), device, options);
  // The in-memory checkpoint held the unfused originals; they are garbage now.
  if (device == Device::cuda) release_cached_device_memory();
  return model;
}

}  // namespace mere
