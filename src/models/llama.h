// Llama 2/3, Qwen2 and Qwen3 dense: config, weights and forward.
#pragma once

#include <optional>

#include "io/checkpoint.h"
#include "io/config.h"
#include "models/blocks/attention_inputs.h"
#include "models/blocks/attention_weights.h"
#include "models/blocks/projections.h"
#include "models/model.h"
#include "ops/ops.h"
#include "quant/quant_config.h"

namespace mere {

struct LlamaConfig {
  std::string model_type;
  int d_model = 0, d_ff = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t vocab = 0, max_positions = 0;
  float norm_eps = 1e-6f;
  bool tie_embeddings = false;
  bool attention_bias = false;  // q/k/v (and for Llama also o) carry a bias
  bool o_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;         // Qwen3: per-head RMSNorm on q and k before RoPE
  ops::RopeTable rope;

  static LlamaConfig parse(const ConfigJson& c);
  AttentionShape attention_shape() const;
  // Every checkpoint tensor this config needs, by name, with its shape.
  std::vector<std::pair<std::string, Shape>> tensor_shapes() const;
};

struct LlamaLayer {
  Tensor attn_norm, mlp_norm;
  AttentionWeights attn;
  GatedMlp mlp;
};

class Llama : public Model {
 public:
  Llama(const ConfigJson& config, const Checkpoint& checkpoint, Device device, const LoadOptions& options = {});

  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<SeqState> make_state(int64_t capacity, KvCacheMode kv_mode) const override;
  KvLayout kv_layout(KvCacheMode kv_mode) const override;
  using Model::run;
  Tensor run(const Tensor& ids, const Tensor& pos, std::span<SeqState* const> states, bool all_logits) const override;
  uint64_t decode_bytes(int64_t context, KvCacheMode kv_mode) const override;
  double prefill_flops(int64_t T, int64_t context) const override;
  const LlamaConfig& config() const { return cfg_; }

 private:
  LlamaConfig cfg_;
  ModelInfo info_;
  std::optional<Checkpoint> checkpoint_;  // keeps the mapped weights alive (CPU only: CUDA copies them)
  Weight tok_embed_, lm_head_;
  Tensor final_norm_;
  std::vector<LlamaLayer> layers_;
};

}  // namespace mere
