// Reading one linear (or embedding) weight from a checkpoint in whatever form
// it is stored: dense `<module>.weight`; MLX affine `<module>.weight` (packed
// u32), `.scales`, `.biases`; FP8 `<module>.weight` (E4M3) and
// `.weight_scale_inv`. The form must agree with config.json's quantization: a
// mismatch is an error naming the tensor, never a silent fallback.
#pragma once

#include "io/checkpoint.h"
#include "ops/weight.h"
#include "quant/quant_config.h"

namespace mere {

// `module` is the tensor name without ".weight", e.g. "model.layers.0.mlp.gate_proj";
// `shape` is the logical [out, in], or [n, out, in] for a stack of n matrices
// stored as one tensor (MoE experts), read as [n * out, in]; `why` names the
// config fields it comes from.
Weight load_weight(const Checkpoint& checkpoint, const std::string& module, const Shape& shape, const std::string& why,
                   const QuantizationConfig& quant);

// A linear's bias `name` [n], as f32 (it is added to f32 activations).
Tensor load_bias(const Checkpoint& checkpoint, const std::string& name, int64_t n, const std::string& why);

// The model's parameters as llama.cpp and transformers count them: a packed
// affine weight holds 32 / bits values a word, and its scales and biases (or an
// FP8 weight's block scales) are part of how it is stored, not parameters.
int64_t logical_param_count(const Checkpoint& checkpoint, const QuantizationConfig& quant);

}  // namespace mere
