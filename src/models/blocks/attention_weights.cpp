#include "models/blocks/attention_weights.h"

#include "quant/load_weight.h"

namespace mere {

uint64_t AttentionWeights::size_bytes() const {
  uint64_t bytes = qkv.size_bytes() + o.size_bytes();
  for (const Tensor* t : {&o_bias, &q_norm, &k_norm})
    if (t->defined()) bytes += t->size_bytes();
  return bytes;
}

AttentionWeights load_attention(const Checkpoint& checkpoint, const std::string& prefix, const AttentionShape& s,
                                const QuantizationConfig& quant, Device device, bool fuse_qkv) {
  const int64_t q_dim = s.n_heads * s.head_dim, kv_dim = s.n_kv_heads * s.head_dim;
  auto bias = [&](const std::string& name, int64_t n, const char* why) {
    return load_bias(checkpoint, prefix + name, n, why);
  };
  auto weight = [&](const std::string& module, Shape shape, const char* why) {
    return load_weight(checkpoint, prefix + module, shape, why, quant);
  };
  AttentionWeights w;
  w.qkv.q = weight("q_proj", {q_dim, s.d_model}, "num_attention_heads * head_dim, hidden_size");
  w.qkv.k = weight("k_proj", {kv_dim, s.d_model}, "num_key_value_heads * head_dim, hidden_size");
  w.qkv.v = weight("v_proj", {kv_dim, s.d_model}, "num_key_value_heads * head_dim, hidden_size");
  w.o = weight("o_proj", {s.d_model, q_dim}, "hidden_size, num_attention_heads * head_dim").to_device(device);
  if (s.qkv_bias) {
    w.qkv.q_bias = bias("q_proj.bias", q_dim, "num_attention_heads * head_dim");
    w.qkv.k_bias = bias("k_proj.bias", kv_dim, "num_key_value_heads * head_dim");
    w.qkv.v_bias = bias("v_proj.bias", kv_dim, "num_key_value_heads * head_dim");
  }
  if (s.o_bias) w.o_bias = bias("o_proj.bias", s.d_model, "hidden_size").to_device(device);
  if (s.qk_norm) {
    w.q_norm = checkpoint.get(prefix + "q_norm.weight", {s.head_dim}, "head_dim").to_device(device);
    w.k_norm = checkpoint.get(prefix + "k_norm.weight", {s.head_dim}, "head_dim").to_device(device);
  }
  // Old Llama checkpoints store the RoPE table; it is recomputed from the config.
  if (checkpoint.has(prefix + "rotary_emb.inv_freq")) checkpoint.get(prefix + "rotary_emb.inv_freq");
  if (fuse_qkv) w.qkv.fuse();
  w.qkv.to_device(device);
  return w;
}

std::vector<std::pair<std::string, Shape>> attention_tensor_shapes(const std::string& prefix, const AttentionShape& s) {
  const int64_t q_dim = s.n_heads * s.head_dim, kv_dim = s.n_kv_heads * s.head_dim;
  std::vector<std::pair<std::string, Shape>> out = {{prefix + "q_proj.weight", {q_dim, s.d_model}},
                                                    {prefix + "k_proj.weight", {kv_dim, s.d_model}},
                                                    {prefix + "v_proj.weight", {kv_dim, s.d_model}},
                                                    {prefix + "o_proj.weight", {s.d_model, q_dim}}};
  if (s.qkv_bias) {
    out.push_back({prefix + "q_proj.bias", {q_dim}});
    out.push_back({prefix + "k_proj.bias", {kv_dim}});
    out.push_back({prefix + "v_proj.bias", {kv_dim}});
  }
  if (s.o_bias) out.push_back({prefix + "o_proj.bias", {s.d_model}});
  if (s.qk_norm) {
    out.push_back({prefix + "q_norm.weight", {s.head_dim}});
    out.push_back({prefix + "k_norm.weight", {s.head_dim}});
  }
  return out;
}

}  // namespace mere
