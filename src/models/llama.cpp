// models/llama.cpp: Llama 2/3, Qwen2, Qwen3 dense.
// Reference: transformers modeling_llama.py, modeling_qwen2.py, modeling_qwen3.py
// (LlamaAttention / Qwen3Attention, LlamaDecoderLayer, LlamaForCausalLM).
#include "models/llama.h"

#include "models/blocks/mlp_weights.h"
#include "models/blocks/token_embeddings.h"
#include "quant/load_weight.h"

#include <algorithm>
#include <cmath>

#include "models/blocks/rope_scaling.h"

namespace mere {

LlamaConfig LlamaConfig::parse(const ConfigJson& c) {
  LlamaConfig k;
  k.model_type = c.require<std::string>("model_type");
  k.d_model = c.require<int>("hidden_size");
  k.d_ff = c.require<int>("intermediate_size");
  k.n_layers = c.require<int>("num_hidden_layers");
  k.n_heads = c.require<int>("num_attention_heads");
  k.n_kv_heads = c.get<int>("num_key_value_heads", k.n_heads);
  k.head_dim = c.get<int>("head_dim", k.n_heads > 0 ? k.d_model / k.n_heads : 0);
  k.vocab = c.require<int64_t>("vocab_size");
  k.max_positions = c.get<int64_t>("max_position_embeddings", 4096);
  k.norm_eps = c.get<float>("rms_norm_eps", 1e-6f);
  k.tie_embeddings = c.get<bool>("tie_word_embeddings", false);
  k.qk_norm = k.model_type == "qwen3";
  if (k.model_type == "qwen2") {
    k.attention_bias = true;  // Qwen2 always has q/k/v biases and no o bias
  } else {
    k.attention_bias = c.get<bool>("attention_bias", false);
    k.o_bias = k.attention_bias;  // Llama and Qwen3 put it on all four projections
  }
  k.mlp_bias = k.model_type == "llama" && c.get<bool>("mlp_bias", false);
  c.refuse_unless("hidden_act", "silu");  // we implement SwiGLU only
  MERE_CHECK(!c.get<bool>("use_sliding_window", false),
             "{}: use_sliding_window is true; sliding-window attention is not supported yet", c.path().string());
  if (c.has("layer_types"))
    for (const auto& t : c.raw()["layer_types"])
      MERE_CHECK(t == "full_attention", "{}: layer_types has '{}'; only full_attention is supported",
                 c.path().string(), t.dump());
  MERE_CHECK(k.d_model > 0 && k.n_layers > 0 && k.n_heads > 0 && k.head_dim > 0 && k.vocab > 0 && k.d_ff > 0,
             "{}: sizes must be positive", c.path().string());
  // A negative epsilon makes some 1/rms NaN; JSON cannot write NaN, and 1e400 fails to parse.
  MERE_CHECK(k.norm_eps >= 0, "{}: rms_norm_eps {} must be zero or more", c.path().string(), k.norm_eps);
  MERE_CHECK(k.n_kv_heads > 0 && k.n_heads % k.n_kv_heads == 0,
             "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", c.path().string(),
             k.n_heads, k.n_kv_heads);
  k.rope = rope_table_from_config(c, k.head_dim);
  return k;
}

AttentionShape LlamaConfig::attention_shape() const {
  return AttentionShape{.d_model = d_model, .n_heads = n_heads, .n_kv_heads = n_kv_heads, .head_dim = head_dim,
                        .qkv_bias = attention_bias, .o_bias = o_bias, .qk_norm = qk_norm};
}

std::vector<std::pair<std::string, Shape>> LlamaConfig::tensor_shapes() const {
  std::vector<std::pair<std::string, Shape>> out = {{"model.embed_tokens.weight", {vocab, d_model}},
                                                    {"model.norm.weight", {d_model}}};
  if (!tie_embeddings) out.push_back({"lm_head.weight", {vocab, d_model}});
  for (int l = 0; l < n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {d_model}});
    out.push_back({p + "post_attention_layernorm.weight", {d_model}});
    for (auto& t : attention_tensor_shapes(p + "self_attn.", attention_shape())) out.push_back(std::move(t));
    for (auto& t : gated_mlp_tensor_shapes(p + "mlp.", {d_model, d_ff, mlp_bias})) out.push_back(std::move(t));
  }
  return out;
}

namespace {

// Lever fused_norm_matvec, auto: a step folds its norms where every layer
// matrix's matvec of its rows runs on the tensor cores (MLX affine or FP8) in its
// fused form, whose prepare kernel forms the input, and from 17 rows where every
// one is a dequantizing GEMM that forms its input (lever formed_gemm_input;
// ModelInfo::decide_folding); elsewhere the forms compose kernels and cost more
// than they save (docs/levers.md).
std::vector<const Weight*> fused_form_weights(const std::vector<LlamaLayer>& layers) {
  std::vector<const Weight*> out;
  for (const LlamaLayer& l : layers) {
    const auto qkv = l.attn.qkv.matrices(), mlp = l.mlp.matrices();
    out.insert(out.end(), qkv.begin(), qkv.end());
    out.push_back(&l.attn.o);
    out.insert(out.end(), mlp.begin(), mlp.end());
  }
  return out;
}

}  // namespace

Llama::Llama(const ConfigJson& config, const Checkpoint& checkpoint, Device device, const LoadOptions& options)
    : cfg_(LlamaConfig::parse(config)) {
  if (device == Device::cpu) checkpoint_ = checkpoint;
  const LlamaConfig& k = cfg_;
  auto get = [&](const std::string& name, Shape shape, const char* why) {
    return checkpoint.get(name, shape, why).to_device(device);
  };
  const QuantizationConfig quant = QuantizationConfig::parse(config);
  TokenEmbeddings e = load_token_embeddings(checkpoint, k.vocab, k.d_model, k.tie_embeddings, quant, device);
  tok_embed_ = e.embed;
  lm_head_ = e.lm_head;
  final_norm_ = e.final_norm;
  for (int l = 0; l < k.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LlamaLayer w;
    w.attn_norm = get(p + "input_layernorm.weight", {k.d_model}, "hidden_size");
    w.mlp_norm = get(p + "post_attention_layernorm.weight", {k.d_model}, "hidden_size");
    w.attn = load_attention(checkpoint, p + "self_attn.", k.attention_shape(), quant, device,
                            options.fuse_projections);
    w.mlp = load_gated_mlp(checkpoint, p + "mlp.", {k.d_model, k.d_ff, k.mlp_bias}, quant, device,
                           options.fuse_projections);
    layers_.push_back(std::move(w));
  }
  if (device == Device::cuda) release_cached_device_memory();  // load-time temporaries
  std::vector<std::string> unused = checkpoint.unused();
  MERE_CHECK(unused.empty(), "{}: {} tensor(s) the {} family does not use, e.g. {}", checkpoint.path().string(),
             unused.size(), k.model_type, unused.empty() ? "" : unused.front());

  info_.model_type = k.model_type;
  info_.family = "llama";
  info_.device = device;
  info_.options = options;
  info_.vocab = k.vocab;
  info_.max_positions = k.max_positions;
  info_.weight_bytes = checkpoint.size_bytes();
  info_.weights = layers_.empty() ? tok_embed_.describe() : layers_.front().attn.o.describe();
  info_.n_params = logical_param_count(checkpoint, quant);
  info_.decide_folding(options.fuse_norm_matvec, options, fused_form_weights(layers_), true);
}

uint64_t Llama::decode_bytes(int64_t context, KvCacheMode kv_mode) const {
  uint64_t bytes = tok_embed_.size_bytes() / uint64_t(cfg_.vocab) + final_norm_.size_bytes() + lm_head_.size_bytes();
  for (const LlamaLayer& w : layers_) {
    bytes += w.attn.size_bytes() + w.mlp.size_bytes() + w.attn_norm.size_bytes() + w.mlp_norm.size_bytes();
  }
  const uint64_t kv_row = kv_row_bytes(cfg_.n_kv_heads, cfg_.head_dim, kv_mode, info_.device);
  bytes += uint64_t(context) * 2 * uint64_t(cfg_.n_layers) * kv_row;  // K and V of every cached position
  return bytes;
}

double Llama::prefill_flops(int64_t T, int64_t context) const {
  const double q_dim = double(cfg_.n_heads) * cfg_.head_dim, kv_dim = double(cfg_.n_kv_heads) * cfg_.head_dim;
  const double per_token_matmul =
      2.0 * cfg_.n_layers * (cfg_.d_model * (q_dim + 2 * kv_dim) + q_dim * cfg_.d_model + 3.0 * cfg_.d_model * cfg_.d_ff);
  // Causal attention: each token scores and mixes context + its own position (q.k and p.v).
  const double avg_keys = double(context) + double(T + 1) / 2;
  const double attention = 4.0 * cfg_.n_layers * q_dim * avg_keys;
  return T * (per_token_matmul + attention) + 2.0 * cfg_.d_model * double(cfg_.vocab);  // lm_head on the last token
}

KvLayout Llama::kv_layout(KvCacheMode kv_mode) const {
  return {cfg_.n_layers, cfg_.n_kv_heads, cfg_.head_dim, kv_mode, info_.device};
}

std::unique_ptr<SeqState> Llama::make_state(int64_t capacity, KvCacheMode kv_mode) const {
  return SeqState::for_layout(kv_layout(kv_mode), capacity > 0 ? capacity : cfg_.max_positions);
}

Tensor Llama::run(const Tensor& ids, const Tensor& pos, std::span<SeqState* const> states, bool all_logits) const {
  const LlamaConfig& k = cfg_;
  const int64_t T = ids.numel();

  apply_launch_settings(info_.options, info_.device);
  const bool fold_norms = info_.folds_step(T);

  Tensor h = ops::embed(tok_embed_, ids);                                      // [T, d_model], the residual
  Tensor x;                                                                    // the normed input, unless folded
  if (!fold_norms) x = ops::rms_norm(h, layers_[0].attn_norm, k.norm_eps);
  for (int l = 0; l < k.n_layers; ++l) {
    const LlamaLayer& w = layers_[size_t(l)];
    auto [q, kk, v] = fold_norms ? w.attn.qkv.apply_normed(h, w.attn_norm, k.norm_eps) : w.attn.qkv.apply(x);
    q = q.reshape({T, k.n_heads, k.head_dim});
    kk = kk.reshape({T, k.n_kv_heads, k.head_dim});
    v = v.reshape({T, k.n_kv_heads, k.head_dim});
    // Qwen3's per-head q/k RMSNorm (w.q_norm defined), RoPE, the cache write, attention.
    // Folded, a split-K decode attention is merged on its way into o_proj.
    ops::AttentionSplits splits;
    Tensor a = attend_cached(q, kk, v, w.attn.q_norm, w.attn.k_norm, k.norm_eps, k.rope, pos, states, l,
                             info_.options.fuse_rope_store, fold_norms ? &splits : nullptr);  // [T, n_heads * head_dim]
    if (fold_norms) {
      if (a.defined()) ops::linear_add(h, a, w.attn.o, w.attn.o_bias);
      else ops::attention_linear_add(h, splits, w.attn.o, w.attn.o_bias);
      w.mlp.add_normed(h, w.mlp_norm, k.norm_eps);
      continue;
    }
    // The residual add and the next RMSNorm in one pass, twice per layer.
    x = ops::add_rms_norm(h, ops::linear(a, w.attn.o, w.attn.o_bias), w.mlp_norm, k.norm_eps);
    const Tensor& next_norm = l + 1 < k.n_layers ? layers_[size_t(l) + 1].attn_norm : final_norm_;
    x = ops::add_rms_norm(h, w.mlp.apply(x), next_norm, k.norm_eps);
  }
  if (fold_norms) {
    return final_logits(logit_rows(h, states, all_logits), final_norm_, k.norm_eps, lm_head_);
  }
  return ops::linear(logit_rows(x, states, all_logits), lm_head_);             // [T or 1, vocab]
}

}  // namespace mere
