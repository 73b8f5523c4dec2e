// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention with a sparse
// mixture of experts in place of the MLP on every decoder_sparse_step-th layer
// not listed in mlp_only_layers.
#pragma once

#include <optional>

#include "io/checkpoint.h"
#include "io/config.h"
#include "models/blocks/attention_weights.h"
#include "models/blocks/moe.h"
#include "models/llama.h"
#include "models/model.h"

namespace mere {

struct Qwen3MoeConfig {
  LlamaConfig dense;  // everything but the experts (attention, dense MLP layers, norms, RoPE)
  int n_experts = 0, top_k = 0, moe_d_ff = 0, sparse_step = 1;
  bool norm_topk_prob = false;
  std::vector<int> mlp_only_layers;

  static Qwen3MoeConfig parse(const ConfigJson& c);
  // Whether layer l has experts (transformers' Qwen3MoeDecoderLayer rule).
  bool sparse(int l) const;
  // Every checkpoint tensor, experts in mlx-lm's stacked layout (switch_mlp).
  std::vector<std::pair<std::string, Shape>> tensor_shapes() const;
};

struct Qwen3MoeLayer {
  Tensor attn_norm, mlp_norm;
  AttentionWeights attn;
  std::optional<MoeBlock> moe;  // sparse layers
  GatedMlp mlp;                 // dense layers
};

class Qwen3Moe : public Model {
 public:
  Qwen3Moe(const ConfigJson& config, const Checkpoint& checkpoint, Device device, const LoadOptions& options = {});

  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<SeqState> make_state(int64_t capacity, KvCacheMode kv_mode) const override;
  KvLayout kv_layout(KvCacheMode kv_mode) const override;
  using Model::run;
  Tensor run(const Tensor& ids, const Tensor& pos, std::span<SeqState* const> states, bool all_logits) const override;
  uint64_t decode_bytes(int64_t context, KvCacheMode kv_mode) const override;
  double prefill_flops(int64_t T, int64_t context) const override;
  const Qwen3MoeConfig& config() const { return cfg_; }

 private:
  // run() under lever fused_norm_matvec, from the embedded residual h.
  Tensor run_folded(Tensor& h, const Tensor& pos, std::span<SeqState* const> states, bool all_logits) const;

  Qwen3MoeConfig cfg_;
  ModelInfo info_;
  std::optional<Checkpoint> checkpoint_;  // keeps the mapped weights alive on the CPU
  Weight tok_embed_, lm_head_;
  Tensor final_norm_;
  std::vector<Qwen3MoeLayer> layers_;
};

}  // namespace mere
