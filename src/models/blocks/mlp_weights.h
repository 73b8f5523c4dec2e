// The SwiGLU MLP as dense decoder layers store it under `model.layers.<l>.mlp.`
// (Llama, Qwen2, Qwen3, and Qwen3-MoE's dense layers), and its loader.
#pragma once

#include "io/checkpoint.h"
#include "models/blocks/projections.h"
#include "quant/quant_config.h"

namespace mere {

struct MlpShape {
  int64_t d_model = 0, d_ff = 0;
  bool bias = false;  // gate, up and down carry biases (Llama's mlp_bias)
};

// Reads `prefix` ("model.layers.3.mlp.") into `device`'s memory, gate and up
// fused into one matrix when `fuse_gate_up` (lever fused_projections). Biases
// become f32 (they are added to f32 activations); the rest keeps its stored dtype.
GatedMlp load_gated_mlp(const Checkpoint& checkpoint, const std::string& prefix, const MlpShape& shape,
                        const QuantizationConfig& quant, Device device, bool fuse_gate_up);

// The checkpoint names and shapes load_gated_mlp reads (dense storage).
std::vector<std::pair<std::string, Shape>> gated_mlp_tensor_shapes(const std::string& prefix, const MlpShape& shape);

}  // namespace mere
