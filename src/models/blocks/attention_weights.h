// The weights of standard (GQA) self-attention, as Llama, Qwen2, Qwen3 and
// Qwen3-MoE store them under `model.layers.<l>.self_attn.`, and their loader.
#pragma once

#include "io/checkpoint.h"
#include "models/blocks/projections.h"
#include "quant/quant_config.h"

namespace mere {

struct AttentionShape {
  int64_t d_model = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  bool qkv_bias = false;  // q/k/v carry a bias (Qwen2; attention_bias)
  bool o_bias = false;    // o carries one too (Llama, Qwen3 with attention_bias)
  bool qk_norm = false;   // per-head RMSNorm of q and k (Qwen3)
};

struct AttentionWeights {
  QkvProjection qkv;
  Weight o;               // [d_model, n_heads * head_dim]
  Tensor o_bias;
  Tensor q_norm, k_norm;  // [head_dim], qk_norm only

  uint64_t size_bytes() const;
};

// Reads `prefix` ("model.layers.3.self_attn.") into `device`'s memory, q/k/v
// fused into one matrix when `fuse_qkv` (lever fused_projections). Biases become
// f32 (they are added to f32 activations); the rest keeps its stored dtype.
AttentionWeights load_attention(const Checkpoint& checkpoint, const std::string& prefix, const AttentionShape& shape,
                                const QuantizationConfig& quant, Device device, bool fuse_qkv);

// The checkpoint names and shapes load_attention reads (dense storage).
std::vector<std::pair<std::string, Shape>> attention_tensor_shapes(const std::string& prefix,
                                                                   const AttentionShape& shape);

}  // namespace mere
