// models/qwen3_moe.cpp: Qwen3-MoE.
// Reference: transformers modeling_qwen3_moe.py (Qwen3MoeAttention,
// Qwen3MoeSparseMoeBlock, Qwen3MoeDecoderLayer, Qwen3MoeForCausalLM).
#include "models/qwen3_moe.h"

#include <algorithm>

#include "models/blocks/mlp_weights.h"
#include "models/blocks/token_embeddings.h"
#include "quant/load_weight.h"

namespace mere {

Qwen3MoeConfig Qwen3MoeConfig::parse(const ConfigJson& c) {
  Qwen3MoeConfig k;
  k.dense = LlamaConfig::parse(c);
  k.dense.qk_norm = true;  // Qwen3MoeAttention always has q_norm and k_norm
  // Published configs say num_experts; transformers 5 writes its alias num_local_experts.
  k.n_experts = c.has("num_experts") ? c.require<int>("num_experts") : c.require<int>("num_local_experts");
  k.top_k = c.require<int>("num_experts_per_tok");
  k.moe_d_ff = c.require<int>("moe_intermediate_size");
  k.sparse_step = c.get<int>("decoder_sparse_step", 1);
  k.norm_topk_prob = c.get<bool>("norm_topk_prob", false);
  k.mlp_only_layers = c.get<std::vector<int>>("mlp_only_layers", {});
  const std::string file = c.path().string();
  MERE_CHECK(k.n_experts >= 0 && k.moe_d_ff > 0 && k.sparse_step > 0, "{}: num_experts {}, moe_intermediate_size {} "
             "and decoder_sparse_step {} must be positive", file, k.n_experts, k.moe_d_ff, k.sparse_step);
  MERE_CHECK(k.n_experts == 0 || (k.top_k >= 1 && k.top_k <= k.n_experts),
             "{}: num_experts_per_tok {} must be in [1, num_experts = {}]", file, k.top_k, k.n_experts);
  return k;
}

namespace {

// Lever fused_norm_matvec, auto: a step folds its norms where every matrix a
// folded step runs in its fused form takes the tensor cores at the step's rows
// (ModelInfo::decide_folding): the attention's (the RMSNorm'd input for q/k/v,
// attention's splits merged for o) and a dense layer's MLP; the experts have
// their own kernels. Qwen3-30B-A3B's affine attention matrices (2^23 weights and
// up) do at one row: int4 decode +8.0% at batch 1 (docs/benchmarks.md); FP8 ones
// only from two rows.
std::vector<const Weight*> fused_form_weights(const std::vector<Qwen3MoeLayer>& layers) {
  std::vector<const Weight*> out;
  for (const Qwen3MoeLayer& l : layers) {
    const auto qkv = l.attn.qkv.matrices();
    out.insert(out.end(), qkv.begin(), qkv.end());
    out.push_back(&l.attn.o);
    if (!l.moe) {
      const auto mlp = l.mlp.matrices();
      out.insert(out.end(), mlp.begin(), mlp.end());
    }
  }
  return out;
}

}  // namespace

bool Qwen3MoeConfig::sparse(int l) const {
  return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), l) == mlp_only_layers.end() && n_experts > 0 &&
         (l + 1) % sparse_step == 0;
}

std::vector<std::pair<std::string, Shape>> Qwen3MoeConfig::tensor_shapes() const {
  const LlamaConfig& k = dense;
  const int64_t d = k.d_model, E = n_experts, f = moe_d_ff;
  std::vector<std::pair<std::string, Shape>> out = {{"model.embed_tokens.weight", {k.vocab, d}},
                                                    {"model.norm.weight", {d}}};
  if (!k.tie_embeddings) out.push_back({"lm_head.weight", {k.vocab, d}});
  for (int l = 0; l < k.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {d}});
    out.push_back({p + "post_attention_layernorm.weight", {d}});
    for (auto& t : attention_tensor_shapes(p + "self_attn.", k.attention_shape())) out.push_back(std::move(t));
    if (sparse(l)) {
      out.push_back({p + "mlp.gate.weight", {E, d}});
      out.push_back({p + "mlp.switch_mlp.gate_proj.weight", {E, f, d}});
      out.push_back({p + "mlp.switch_mlp.up_proj.weight", {E, f, d}});
      out.push_back({p + "mlp.switch_mlp.down_proj.weight", {E, d, f}});
    } else {
      for (auto& t : gated_mlp_tensor_shapes(p + "mlp.", {d, k.d_ff})) out.push_back(std::move(t));
    }
  }
  return out;
}

Qwen3Moe::Qwen3Moe(const ConfigJson& config, const Checkpoint& checkpoint, Device device, const LoadOptions& options)
    : cfg_(Qwen3MoeConfig::parse(config)) {
  if (device == Device::cpu) checkpoint_ = checkpoint;
  const LlamaConfig& k = cfg_.dense;
  const QuantizationConfig quant = QuantizationConfig::parse(config);
  auto get = [&](const std::string& name, Shape shape, const char* why) {
    return checkpoint.get(name, shape, why).to_device(device);
  };
  auto get_weight = [&](const std::string& module, Shape shape, const char* why) {
    return load_weight(checkpoint, module, shape, why, quant);
  };
  TokenEmbeddings e = load_token_embeddings(checkpoint, k.vocab, k.d_model, k.tie_embeddings, quant, device);
  tok_embed_ = e.embed;
  lm_head_ = e.lm_head;
  final_norm_ = e.final_norm;
  for (int l = 0; l < k.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Qwen3MoeLayer w;
    w.attn_norm = get(p + "input_layernorm.weight", {k.d_model}, "hidden_size");
    w.mlp_norm = get(p + "post_attention_layernorm.weight", {k.d_model}, "hidden_size");
    w.attn = load_attention(checkpoint, p + "self_attn.", k.attention_shape(), quant, device, options.fuse_projections);
    if (cfg_.sparse(l)) {
      MoeBlock moe;
      moe.router = get_weight(p + "mlp.gate", {cfg_.n_experts, k.d_model}, "num_experts, hidden_size").to_device(device);
      moe.routing = {.score = ops::MoeRouting::Score::softmax, .top_k = cfg_.top_k, .renormalize = cfg_.norm_topk_prob};
      moe.experts = load_experts(checkpoint, p + "mlp.", cfg_.n_experts, cfg_.moe_d_ff, k.d_model, quant, device,
                                 options.fuse_moe_gate_up);
      w.moe = std::move(moe);
    } else {
      // Qwen3MoeMLP has no biases.
      w.mlp = load_gated_mlp(checkpoint, p + "mlp.", {k.d_model, k.d_ff}, quant, device, options.fuse_projections);
    }
    layers_.push_back(std::move(w));
  }
  if (device == Device::cuda) release_cached_device_memory();  // load-time temporaries
  std::vector<std::string> unused = checkpoint.unused();
  MERE_CHECK(unused.empty(), "{}: {} tensor(s) the qwen3_moe family does not use, e.g. {}",
             checkpoint.path().string(), unused.size(), unused.empty() ? "" : unused.front());

  info_.model_type = k.model_type;
  info_.family = "qwen3_moe";
  info_.device = device;
  info_.options = options;
  info_.decide_folding(device == Device::cuda ? options.fuse_norm_matvec : LeverMode::off, options,
                       fused_form_weights(layers_));
  info_.vocab = k.vocab;
  info_.max_positions = k.max_positions;
  info_.weight_bytes = checkpoint.size_bytes();
  info_.weights = layers_.empty() ? tok_embed_.describe() : layers_.front().attn.o.describe();
  info_.n_params = logical_param_count(checkpoint, quant);
}

uint64_t Qwen3Moe::decode_bytes(int64_t context, KvCacheMode kv_mode) const {
  const LlamaConfig& k = cfg_.dense;
  uint64_t bytes = tok_embed_.size_bytes() / uint64_t(k.vocab) + final_norm_.size_bytes() + lm_head_.size_bytes();
  for (const Qwen3MoeLayer& w : layers_) {
    bytes += w.attn.size_bytes() + w.attn_norm.size_bytes() + w.mlp_norm.size_bytes();
    bytes += w.moe ? w.moe->decode_bytes() : w.mlp.size_bytes();  // only the k routed experts are read
  }
  const uint64_t kv_row = kv_row_bytes(k.n_kv_heads, k.head_dim, kv_mode, info_.device);
  bytes += uint64_t(context) * 2 * uint64_t(k.n_layers) * kv_row;  // K and V of every cached position
  return bytes;
}

double Qwen3Moe::prefill_flops(int64_t T, int64_t context) const {
  const LlamaConfig& k = cfg_.dense;
  const double q_dim = double(k.n_heads) * k.head_dim, kv_dim = double(k.n_kv_heads) * k.head_dim;
  double per_token = 0;
  for (int l = 0; l < k.n_layers; ++l) {
    per_token += 2.0 * (k.d_model * (q_dim + 2 * kv_dim) + q_dim * k.d_model);
    per_token += cfg_.sparse(l) ? 2.0 * k.d_model * (cfg_.n_experts + 3.0 * cfg_.top_k * cfg_.moe_d_ff)
                                : 6.0 * k.d_model * k.d_ff;
  }
  const double avg_keys = double(context) + double(T + 1) / 2;  // causal: each token sees context + its prefix
  const double attention = 4.0 * k.n_layers * q_dim * avg_keys;
  return T * (per_token + attention) + 2.0 * k.d_model * double(k.vocab);  // lm_head on the last token
}

KvLayout Qwen3Moe::kv_layout(KvCacheMode kv_mode) const {
  const LlamaConfig& k = cfg_.dense;
  return {k.n_layers, k.n_kv_heads, k.head_dim, kv_mode, info_.device};
}

std::unique_ptr<SeqState> Qwen3Moe::make_state(int64_t capacity, KvCacheMode kv_mode) const {
  return SeqState::for_layout(kv_layout(kv_mode), capacity > 0 ? capacity : cfg_.dense.max_positions);
}

Tensor Qwen3Moe::run(const Tensor& ids, const Tensor& pos, std::span<SeqState* const> states, bool all_logits) const {
  const LlamaConfig& k = cfg_.dense;
  const int64_t T = ids.numel();
  apply_launch_settings(info_.options, info_.device);

  Tensor h = ops::embed(tok_embed_, ids);                                   // [T, d_model], the residual
  if (info_.folds_step(T)) return run_folded(h, pos, states, all_logits);
  Tensor x = ops::rms_norm(h, layers_[0].attn_norm, k.norm_eps);
  for (int l = 0; l < k.n_layers; ++l) {
    const Qwen3MoeLayer& w = layers_[size_t(l)];
    auto [q, kk, v] = w.attn.qkv.apply(x);
    q = q.reshape({T, k.n_heads, k.head_dim});
    kk = kk.reshape({T, k.n_kv_heads, k.head_dim});
    v = v.reshape({T, k.n_kv_heads, k.head_dim});
    Tensor a = attend_cached(q, kk, v, w.attn.q_norm, w.attn.k_norm, k.norm_eps, k.rope, pos, states, l,
                             info_.options.fuse_rope_store);               // [T, n_heads * head_dim]
    x = ops::add_rms_norm(h, ops::linear(a, w.attn.o, w.attn.o_bias), w.mlp_norm, k.norm_eps);
    const Tensor y = w.moe ? w.moe->apply(x) : w.mlp.apply(x);             // experts or the dense MLP
    const Tensor& next_norm = l + 1 < k.n_layers ? layers_[size_t(l) + 1].attn_norm : final_norm_;
    x = ops::add_rms_norm(h, y, next_norm, k.norm_eps);
  }
  return ops::linear(logit_rows(x, states, all_logits), lm_head_);          // [T or 1, vocab]
}

// The fused forms (lever fused_norm_matvec): q/k/v take h through their
// RMSNorm'd prepare, a split-K decode attention is merged on its way into
// o_proj, which adds into h, the router and the experts' first kernel each
// normalize h themselves, and the experts' down adds into h.
Tensor Qwen3Moe::run_folded(Tensor& h, const Tensor& pos, std::span<SeqState* const> states, bool all_logits) const {
  const LlamaConfig& k = cfg_.dense;
  const int64_t T = h.dim(0);
  for (int l = 0; l < k.n_layers; ++l) {
    const Qwen3MoeLayer& w = layers_[size_t(l)];
    auto [q, kk, v] = w.attn.qkv.apply_normed(h, w.attn_norm, k.norm_eps);
    q = q.reshape({T, k.n_heads, k.head_dim});
    kk = kk.reshape({T, k.n_kv_heads, k.head_dim});
    v = v.reshape({T, k.n_kv_heads, k.head_dim});
    ops::AttentionSplits splits;
    Tensor a = attend_cached(q, kk, v, w.attn.q_norm, w.attn.k_norm, k.norm_eps, k.rope, pos, states, l,
                             info_.options.fuse_rope_store, &splits);
    if (a.defined()) ops::linear_add(h, a, w.attn.o, w.attn.o_bias);
    else ops::attention_linear_add(h, splits, w.attn.o, w.attn.o_bias);
    if (w.moe) {
      w.moe->add_normed(h, w.mlp_norm, k.norm_eps);
    } else {
      w.mlp.add_normed(h, w.mlp_norm, k.norm_eps);
    }
  }
  return final_logits(logit_rows(h, states, all_logits), final_norm_, k.norm_eps, lm_head_);
}

}  // namespace mere
