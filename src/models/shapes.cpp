#include "models/shapes.h"

#include <fmt/ranges.h>

#include <cmath>

#include "io/checkpoint.h"
#include "io/config.h"
#include "models/llama.h"
#include "models/qwen3_moe.h"
#include "ops/ops.h"

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
  if (name == "qwen3-4b")  // Qwen/Qwen3-4B: a hidden size (2560) that is no power of two
    return json{{"model_type", "qwen3"}, {"hidden_size", 2560}, {"intermediate_size", 9728},
                {"num_hidden_layers", 36}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
                {"head_dim", 128}, {"vocab_size", 151936}, {"max_position_embeddings", 40960},
                {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0}, {"tie_word_embeddings", true},
                {"hidden_act", "silu"}};
  if (name == "qwen3-0.6b")  // Qwen/Qwen3-0.6B
    return json{{"model_type", "qwen3"}, {"hidden_size", 1024}, {"intermediate_size", 3072},
                {"num_hidden_layers", 28}, {"num_attention_heads", 16}, {"num_key_value_heads", 8},
                {"head_dim", 128}, {"vocab_size", 151936}, {"max_position_embeddings", 40960},
                {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0}, {"tie_word_embeddings", true},
                {"hidden_act", "silu"}};
  if (name == "qwen3-30b-a3b")  // Qwen/Qwen3-30B-A3B
    return json{{"model_type", "qwen3_moe"}, {"hidden_size", 2048}, {"intermediate_size", 6144},
                {"moe_intermediate_size", 768}, {"num_hidden_layers", 48}, {"num_attention_heads", 32},
                {"num_key_value_heads", 4}, {"head_dim", 128}, {"num_experts", 128}, {"num_experts_per_tok", 8},
                {"norm_topk_prob", true}, {"decoder_sparse_step", 1}, {"mlp_only_layers", json::array()},
                {"vocab_size", 151936}, {"max_position_embeddings", 40960}, {"rms_norm_eps", 1e-6},
                {"rope_theta", 1000000.0}, {"tie_word_embeddings", false}, {"hidden_act", "silu"}};
  fail("unknown --shape '{}' (known: {})", name, fmt::join(known_shapes(), ", "));
}

Tensor filled(Shape shape, DType dtype, Device device, uint64_t seed, float scale, float offset) {
  Tensor t = Tensor::empty(std::move(shape), dtype, device);
  ops::fill_random(t, seed, scale, offset);
  return t;
}

constexpr uint64_t kScalesSeed = uint64_t(1) << 40;  // scale streams apart from the next tensor's seed

// The tensors of one matrix `module` [out, in] (or a stack of them [n, out, in],
// MoE experts) in the form `quant` stores it, its values spread like a trained
// model's (uniform in +-a, a = sqrt(3 / in), so activations stay O(1)).
void add_matrix(std::map<std::string, Tensor>& tensors, const std::string& module, const Shape& shape,
                const RandomQuant& quant, Device device, uint64_t seed) {
  const int64_t out = shape.end()[-2], in = shape.end()[-1];
  auto with_stack = [&](Shape s) {
    if (shape.size() == 3) s.insert(s.begin(), shape[0]);
    return s;
  };
  const float a = std::sqrt(3.0f / float(in));
  const bool outside_layers = !module.starts_with("model.layers.");
  if (quant.kind == RandomQuant::Kind::affine) {
    MERE_CHECK(in % quant.group_size == 0, "--group-size {} does not divide {}'s {} columns", quant.group_size,
               module, in);
    // w = scale * q + bias, q in [0, 2^bits): scale 2a / (2^bits - 1) and bias -a (each +-10%).
    Tensor packed = Tensor::empty(with_stack({out, in * quant.bits / 32}), DType::u32, device);
    ops::fill_random_bytes(packed, seed, 0xff);
    const float scale = 2 * a / float((1 << quant.bits) - 1);
    const Shape groups = with_stack({out, in / quant.group_size});
    tensors.emplace(module + ".weight", packed);
    tensors.emplace(module + ".scales",
                    filled(groups, quant.scale_dtype, device, seed + kScalesSeed, 0.1f * scale, scale));
    tensors.emplace(module + ".biases",
                    filled(groups, quant.scale_dtype, device, seed + 2 * kScalesSeed, 0.1f * a, -a));
  } else if (quant.kind == RandomQuant::Kind::fp8 && !outside_layers) {
    // Values of magnitude below 2 (the top exponent bit cleared, which also
    // avoids the NaN pattern 0x7f / 0xff); block scales near a.
    constexpr int64_t kBlock = 128;
    Tensor values = Tensor::empty(shape, DType::f8_e4m3, device);
    ops::fill_random_bytes(values, seed, 0xbf);
    tensors.emplace(module + ".weight", values);
    tensors.emplace(module + ".weight_scale_inv",
                    filled(with_stack({(out + kBlock - 1) / kBlock, (in + kBlock - 1) / kBlock}), DType::f32, device,
                           seed + kScalesSeed, 0.1f * a, a));
  } else {
    tensors.emplace(module + ".weight", filled(shape, DType::bf16, device, seed, a, 0.0f));
  }
}

}  // namespace

RandomQuant RandomQuant::parse(const std::string& name, int group_size, const std::string& scale_dtype) {
  MERE_CHECK(scale_dtype == "bf16" || scale_dtype == "f16", "--scale-dtype '{}': expected bf16 or f16", scale_dtype);
  MERE_CHECK(scale_dtype == "bf16" || name == "int8" || name == "int4",
             "--scale-dtype {}: applies to --quant int8 or int4 (affine scales), not '{}'", scale_dtype, name);
  if (name == "bf16" || name == "none") return {};
  if (name == "fp8") return {Kind::fp8, 0, 0};
  MERE_CHECK(name == "int8" || name == "int4", "--quant '{}': expected bf16, int8, int4 or fp8", name);
  MERE_CHECK(group_size == 32 || group_size == 64 || group_size == 128, "--group-size {}: expected 32, 64 or 128",
             group_size);
  return {Kind::affine, name == "int8" ? 8 : 4, group_size, scale_dtype == "f16" ? DType::f16 : DType::bf16};
}

std::string RandomQuant::describe() const {
  switch (kind) {
    case Kind::affine:
      return fmt::format("int{} g{}{}", bits, group_size, scale_dtype == DType::f16 ? " f16 scales" : "");
    case Kind::fp8: return "fp8";
    default: return "bf16";
  }
}

std::vector<std::string> known_shapes() {
  return {"llama3-8b", "qwen3-8b", "qwen3-4b", "qwen3-0.6b", "qwen3-30b-a3b"};
}

nlohmann::json shape_config(const std::string& name) { return published(name); }

std::unique_ptr<Model> random_model(const std::string& name, Device device, const LoadOptions& options,
                                    uint64_t seed, const RandomQuant& quant, const nlohmann::json& overrides) {
  nlohmann::json json = published(name);
  json.update(overrides);
  if (quant.kind == RandomQuant::Kind::affine)  // as mlx_lm writes it
    json["quantization"] = {{"group_size", quant.group_size}, {"bits", quant.bits}};
  if (quant.kind == RandomQuant::Kind::fp8)
    json["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  ConfigJson config = ConfigJson::from_json(json, name + "/config.json");
  const bool moe = json["model_type"] == "qwen3_moe";
  std::map<std::string, Tensor> tensors;
  uint64_t i = 0;
  for (const auto& [tensor_name, shape] :
       moe ? Qwen3MoeConfig::parse(config).tensor_shapes() : LlamaConfig::parse(config).tensor_shapes()) {
    const uint64_t tensor_seed = seed * 1000003 + i++;
    if (shape.size() >= 2 && tensor_name.ends_with(".weight")) {
      add_matrix(tensors, tensor_name.substr(0, tensor_name.size() - 7), shape, quant, device, tensor_seed);
      continue;
    }
    tensors.emplace(tensor_name, filled(shape, DType::bf16, device, tensor_seed, 0.1f, 1.0f));  // norms near 1
  }
  std::unique_ptr<Model> model;
  {
    const Checkpoint checkpoint = Checkpoint::from_tensors(name, std::move(tensors));
    if (moe) model = std::make_unique<Qwen3Moe>(config, checkpoint, device, options);
    else model = std::make_unique<Llama>(config, checkpoint, device, options);
  }
  // The in-memory checkpoint held the unfused originals; they are garbage now.
  if (device == Device::cuda) release_cached_device_memory();
  return model;
}

}  // namespace mere
