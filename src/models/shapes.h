// Published model configurations, built in memory with random weights so real
// sizes can be measured without downloads (`mere bench --shape NAME`).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model.h"

namespace mere {

std::vector<std::string> known_shapes();
// The config.json of a published model, e.g. "llama3-8b". Unknown names list the known ones.
nlohmann::json shape_config(const std::string& name);

// How random_model stores the matrices, as a quantized checkpoint would: MLX
// affine (every Linear and the embedding: packed u32 `.weight`, bf16 or f16 `.scales`
// and `.biases`, config.json "quantization") or FP8 E4M3 with 128x128 block
// scales (the decoder layers' Linears, as DeepSeek-V3 and Qwen3 FP8 releases:
// `.weight` and f32 `.weight_scale_inv`, "quantization_config" of quant_method fp8).
struct RandomQuant {
  enum class Kind { none, affine, fp8 };
  Kind kind = Kind::none;
  int bits = 0, group_size = 0;
  DType scale_dtype = DType::bf16;  // affine: bf16, or f16 as MLX stores an fp16 model's
  // "bf16" (none), "int8", "int4" (affine with `group_size` and `scale_dtype`
  // "bf16" or "f16") or "fp8".
  static RandomQuant parse(const std::string& name, int group_size = 64, const std::string& scale_dtype = "bf16");
  std::string describe() const;  // "bf16", "int4 g64", "int4 g64 f16 scales", "fp8"
};

// Random weights (never zeros) of that shape, made directly on `device`: bf16,
// or quantized as `quant` says. `overrides` replaces fields of the published
// config (tests: fewer layers, dense layers in a MoE shape).
std::unique_ptr<Model> random_model(const std::string& name, Device device, const LoadOptions& options = {},
                                    uint64_t seed = 1, const RandomQuant& quant = {},
                                    const nlohmann::json& overrides = nlohmann::json::object());

}  // namespace mere
