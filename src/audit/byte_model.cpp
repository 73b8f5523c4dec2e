#include "audit/byte_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "quant/quant_config.h"

namespace mere {
namespace {

constexpr double kBiasBytes = 4;  // mere holds biases as f32

// Bytes are counted in doubles, exact up to 2^53 (9 PB a token, far past any model), so
// that a config with absurd sizes gives an error rather than wrapped uint64 totals.
constexpr double kMostBytesCounted = 9007199254740992.0;  // 2^53
// Layers are counted one by one; past this a config is an error, not a long loop.
constexpr int64_t kMostLayers = 1 << 16;

// A size the byte model multiplies: positive, and at most 2^30, so that a product of two
// (q_dim = heads x head_dim) stays inside int64.
int64_t size_field(const ConfigJson& c, const std::string& key, int64_t value) {
  MERE_CHECK(value > 0 && value <= (int64_t(1) << 30), "{}: {} {}: must be positive and at most 2^30",
             c.path().string(), key, value);
  return value;
}
int64_t required_size(const ConfigJson& c, const std::string& key) {
  return size_field(c, key, c.require<int64_t>(key));
}
int64_t size_or(const ConfigJson& c, const std::string& key, int64_t fallback) {
  return size_field(c, key, c.get<int64_t>(key, fallback));
}
int64_t layer_count(const ConfigJson& c) {
  const int64_t n = c.require<int64_t>("num_hidden_layers");
  MERE_CHECK(n > 0 && n <= kMostLayers, "{}: num_hidden_layers {}: the byte model takes 1 to {}", c.path().string(),
             n, kMostLayers);
  return n;
}

// What a matrix is for: FP8 checkpoints keep the embedding, lm_head and routers dense.
enum class Role { embedding, lm_head, router, block };

// The checkpoint's dense dtype: "f32", "f16" or "bf16" (transformers 5 writes "dtype",
// earlier versions "torch_dtype"; neither: bf16, as most published checkpoints).
std::string dense_dtype(const ConfigJson& c) {
  const std::string dt = c.has("dtype") ? c.require<std::string>("dtype") : c.get<std::string>("torch_dtype", "bfloat16");
  if (dt == "float32") return "f32";
  if (dt == "float16") return "f16";
  if (dt == "bfloat16") return "bf16";
  fail("{}: dtype '{}': the byte model knows float32, float16 and bfloat16", c.path().string(), dt);
}

// How each matrix is stored: the checkpoint's quantization, or --weights.
class WeightBytes {
 public:
  WeightBytes(const ConfigJson& c, const ByteModelOptions& o) {
    dense_name_ = dense_dtype(c);
    const std::string& w = o.weights;
    if (w.empty()) {
      quant_ = QuantizationConfig::parse(c);
      for (const char* key : {"quantization_config", "quantization"})
        if (c.has(key) && c.raw()[key].contains("modules_to_not_convert") &&
            c.raw()[key]["modules_to_not_convert"].is_array())
          for (const auto& m : c.raw()[key]["modules_to_not_convert"])
            if (m.is_string()) not_converted_.push_back(m.get<std::string>());
    } else if (w == "bf16") {
      dense_name_ = "bf16";
    } else if (w == "int8" || w == "int4") {
      MERE_CHECK(o.group_size == 32 || o.group_size == 64 || o.group_size == 128,
                 "--group-size {}: MLX's affine groups are 32, 64 or 128 weights", o.group_size);
      quant_.affine = AffineSpec{w == "int8" ? 8 : 4, o.group_size};
    } else if (w == "fp8") {
      quant_.fp8_block = 128;
    } else {
      fail("--weights {}: expected bf16, int8, int4 or fp8", w);
    }
    override_ = !w.empty();
    dense_ = dense_name_ == "f32" ? 4 : 2;
  }

  double matrix(const std::string& module, int64_t out, int64_t in, Role role) const {
    const double o = double(out), i = double(in);
    if (quant_.fp8_block > 0) {
      const bool kept = role != Role::block ||
                        std::any_of(not_converted_.begin(), not_converted_.end(),
                                    [&](const std::string& m) { return module.find(m) != std::string::npos; });
      if (kept) return o * i * dense_;
      const int64_t b = quant_.fp8_block;
      return o * i + double((out + b - 1) / b) * double((in + b - 1) / b) * 4;  // E4M3 values, f32 block scales
    }
    const std::optional<AffineSpec> spec = override_ ? quant_.affine : quant_.affine_for(module);
    if (spec && in % spec->group_size == 0)  // MLX (and mere quantize) leave other matrices dense
      return std::floor(o * i * spec->bits / 8) + 2 * o * double(in / spec->group_size) * dense_;
    return o * i * dense_;
  }
  double vector(int64_t n) const { return double(n) * dense_; }  // norms

  std::string describe() const {
    if (quant_.fp8_block > 0) return fmt::format("fp8 e4m3 {0}x{0}", quant_.fp8_block);
    if (quant_.affine)
      return fmt::format("affine int{} g{}{}", quant_.affine->bits, quant_.affine->group_size,
                         quant_.affine_modules.empty() ? "" : " (with per-module overrides)");
    if (!quant_.affine_modules.empty()) return "affine (per-module)";
    return dense_name_;
  }

 private:
  std::string dense_name_;
  int dense_ = 2;
  QuantizationConfig quant_;
  std::vector<std::string> not_converted_;
  bool override_ = false;
};

struct Buckets {
  double embedding_row = 0, attention = 0, dense_mlp = 0, routed_experts = 0, shared_experts = 0, routers = 0,
         norms = 0, lm_head = 0, cache = 0;
};

double gated_mlp(const WeightBytes& w, const std::string& p, int64_t d_model, int64_t d_ff) {
  return w.matrix(p + "gate_proj", d_ff, d_model, Role::block) + w.matrix(p + "up_proj", d_ff, d_model, Role::block) +
         w.matrix(p + "down_proj", d_model, d_ff, Role::block);
}

std::string layer_prefix(int l) { return "model.layers." + std::to_string(l) + "."; }

// Llama, Qwen2, Qwen3 and Qwen3-MoE share attention (GQA, optional biases, Qwen3's q/k norm).
void count_gqa(const ConfigJson& c, const WeightBytes& w, const ByteModelOptions& o, ByteModel& m, Buckets& b) {
  const std::string type = m.model_type;
  const int64_t d = required_size(c, "hidden_size");
  const int64_t n_layers = layer_count(c);
  const int64_t n_heads = required_size(c, "num_attention_heads");
  const int64_t n_kv = size_or(c, "num_key_value_heads", n_heads);
  const int64_t head_dim = size_or(c, "head_dim", d / n_heads);
  const int64_t vocab = required_size(c, "vocab_size");
  const int64_t q_dim = n_heads * head_dim, kv_dim = n_kv * head_dim;
  // As LlamaConfig::parse reads them.
  const bool qkv_bias = type == "qwen2" || c.get<bool>("attention_bias", false);
  const bool o_bias = type != "qwen2" && c.get<bool>("attention_bias", false);
  const bool mlp_bias = type == "llama" && c.get<bool>("mlp_bias", false);
  const bool qk_norm = type == "qwen3" || type == "qwen3_moe";

  // Qwen3-MoE: a layer is sparse when it has experts, falls on the sparse step and is not listed dense.
  // Published configs say num_experts; transformers 5 writes its alias num_local_experts.
  const int64_t n_experts =
      type != "qwen3_moe" ? 0 : c.has("num_experts") ? c.get<int64_t>("num_experts", 0) : c.get<int64_t>("num_local_experts", 0);
  if (n_experts != 0) size_field(c, "num_experts", n_experts);
  const int64_t k_experts = n_experts > 0 ? required_size(c, "num_experts_per_tok") : 0;
  const int64_t moe_ff = n_experts > 0 ? required_size(c, "moe_intermediate_size") : 0;
  const int64_t step = c.get<int64_t>("decoder_sparse_step", 1);
  const std::vector<int> mlp_only = c.get<std::vector<int>>("mlp_only_layers", {});
  MERE_CHECK(step >= 1, "{}: decoder_sparse_step must be at least 1, got {}", c.path().string(), step);

  m.n_layers = int(n_layers);
  m.cache = "kv";
  b.embedding_row = w.matrix("model.embed_tokens", 1, d, Role::embedding);
  b.lm_head = w.matrix(c.get<bool>("tie_word_embeddings", false) ? "model.embed_tokens" : "lm_head", vocab, d,
                       Role::lm_head);
  b.norms += w.vector(d);  // final norm
  for (int l = 0; l < int(n_layers); ++l) {
    const std::string p = layer_prefix(l), a = p + "self_attn.";
    b.attention += w.matrix(a + "q_proj", q_dim, d, Role::block) + w.matrix(a + "k_proj", kv_dim, d, Role::block) +
                   w.matrix(a + "v_proj", kv_dim, d, Role::block) + w.matrix(a + "o_proj", d, q_dim, Role::block);
    if (qkv_bias) b.attention += double(q_dim + 2 * kv_dim) * kBiasBytes;
    if (o_bias) b.attention += double(d) * kBiasBytes;
    b.norms += 2 * w.vector(d) + (qk_norm ? 2 * w.vector(head_dim) : 0);
    const bool sparse = n_experts > 0 && (l + 1) % step == 0 &&
                        std::find(mlp_only.begin(), mlp_only.end(), l) == mlp_only.end();
    if (sparse) {
      ++m.n_sparse_layers;
      b.routers += w.matrix(p + "mlp.gate", n_experts, d, Role::router);
      // Only the k experts the router picks are read. (MLX stores them stacked as switch_mlp.)
      b.routed_experts += double(k_experts) * gated_mlp(w, p + "mlp.switch_mlp.", d, moe_ff);
    } else {
      const int64_t d_ff = required_size(c, "intermediate_size");
      b.dense_mlp += gated_mlp(w, p + "mlp.", d, d_ff);
      if (mlp_bias) b.dense_mlp += double(2 * d_ff + d) * kBiasBytes;
    }
  }
  b.cache = double(o.context) * 2 * double(n_layers) * double(kv_row_bytes(n_kv, head_dim, o.kv_mode, o.device));
  if (n_experts > 0)
    m.notes.push_back(fmt::format("{} of {} experts active per token in {} sparse layer(s)", k_experts, n_experts,
                                  m.n_sparse_layers));
}

// DeepSeek-V3 (and its MLA relatives): low-rank q and kv projections, a cached
// latent of kv_lora_rank + qk_rope_head_dim per position, routed + shared experts.
// Reference: transformers modeling_deepseek_v3.py (DeepseekV3Attention, DeepseekV3MoE).
void count_mla(const ConfigJson& c, const WeightBytes& w, const ByteModelOptions& o, ByteModel& m, Buckets& b) {
  const int64_t d = required_size(c, "hidden_size");
  const int64_t n_layers = layer_count(c);
  const int64_t n_heads = required_size(c, "num_attention_heads");
  const int64_t vocab = required_size(c, "vocab_size");
  const int64_t q_lora = c.get<int64_t>("q_lora_rank", 0);
  if (q_lora != 0) size_field(c, "q_lora_rank", q_lora);
  const int64_t kv_lora = required_size(c, "kv_lora_rank");
  const int64_t nope = required_size(c, "qk_nope_head_dim"), rope = required_size(c, "qk_rope_head_dim");
  const int64_t v_dim = required_size(c, "v_head_dim");
  const int64_t n_routed = c.get<int64_t>("n_routed_experts", 0);
  const int64_t n_shared = c.get<int64_t>("n_shared_experts", 0);
  if (n_routed != 0) size_field(c, "n_routed_experts", n_routed);
  if (n_shared != 0) size_field(c, "n_shared_experts", n_shared);
  const int64_t k_experts = n_routed > 0 ? required_size(c, "num_experts_per_tok") : 0;
  const int64_t moe_ff = n_routed > 0 ? required_size(c, "moe_intermediate_size") : 0;
  const int64_t first_dense = c.get<int64_t>("first_k_dense_replace", 0);
  const int64_t freq = c.get<int64_t>("moe_layer_freq", 1);
  const bool score_bias = c.get<std::string>("topk_method", "noaux_tc") == "noaux_tc";
  MERE_CHECK(freq >= 1, "{}: moe_layer_freq must be at least 1, got {}", c.path().string(), freq);
  const int64_t qk_dim = nope + rope;

  m.n_layers = int(n_layers);
  m.cache = "latent";
  b.embedding_row = w.matrix("model.embed_tokens", 1, d, Role::embedding);
  b.lm_head = w.matrix(c.get<bool>("tie_word_embeddings", false) ? "model.embed_tokens" : "lm_head", vocab, d,
                       Role::lm_head);
  b.norms += w.vector(d);
  for (int l = 0; l < int(n_layers); ++l) {
    const std::string p = layer_prefix(l), a = p + "self_attn.";
    if (q_lora > 0) {
      b.attention += w.matrix(a + "q_a_proj", q_lora, d, Role::block) +
                     w.matrix(a + "q_b_proj", n_heads * qk_dim, q_lora, Role::block);
      b.norms += w.vector(q_lora);  // q_a_layernorm
    } else {
      b.attention += w.matrix(a + "q_proj", n_heads * qk_dim, d, Role::block);
    }
    b.attention += w.matrix(a + "kv_a_proj_with_mqa", kv_lora + rope, d, Role::block) +
                   w.matrix(a + "kv_b_proj", n_heads * (nope + v_dim), kv_lora, Role::block) +
                   w.matrix(a + "o_proj", d, n_heads * v_dim, Role::block);
    b.norms += w.vector(kv_lora) + 2 * w.vector(d);  // kv_a_layernorm, input and post-attention norms
    const bool sparse = n_routed > 0 && l >= first_dense && l % freq == 0;
    if (sparse) {
      ++m.n_sparse_layers;
      b.routers += w.matrix(p + "mlp.gate", n_routed, d, Role::router) + (score_bias ? double(n_routed) * 4 : 0);
      b.routed_experts += double(k_experts) * gated_mlp(w, p + "mlp.switch_mlp.", d, moe_ff);
      if (n_shared > 0) b.shared_experts += gated_mlp(w, p + "mlp.shared_experts.", d, n_shared * moe_ff);
    } else {
      b.dense_mlp += gated_mlp(w, p + "mlp.", d, required_size(c, "intermediate_size"));
    }
  }
  b.cache = double(o.context) * double(n_layers) * double(kv_row_bytes(1, kv_lora + rope, o.kv_mode, o.device));
  m.notes.push_back(fmt::format("cache: the MLA latent, {} + {} values per position per layer (mere has no MLA "
                                "cache yet; counted in the cache mode's storage)",
                                kv_lora, rope));
  if (n_routed > 0)
    m.notes.push_back(fmt::format("{} of {} routed experts active per token, {} shared, in {} sparse layer(s)",
                                  k_experts, n_routed, n_shared, m.n_sparse_layers));
  if (c.get<int64_t>("num_nextn_predict_layers", 0) > 0)
    m.notes.push_back("the multi-token-prediction layer(s) are not counted: plain decoding does not run them");
}

}  // namespace

std::vector<std::string> byte_model_families() { return {"llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3"}; }

uint64_t ByteModel::total_bytes() const {
  return std::accumulate(buckets.begin(), buckets.end(), uint64_t(0),
                         [](uint64_t s, const ByteBucket& b) { return s + b.bytes; });
}

uint64_t ByteModel::bucket(const std::string& name) const {
  for (const ByteBucket& b : buckets)
    if (b.name == name) return b.bytes;
  return 0;
}

double ByteModel::roofline_tok_s(double bytes_per_s) const {
  const uint64_t total = total_bytes();
  return total > 0 ? bytes_per_s / double(total) : 0;
}

ByteModel byte_model(const ConfigJson& config, const ByteModelOptions& options) {
  MERE_CHECK(options.context >= 0, "--context {}: must be zero or more", options.context);
  ByteModel m;
  m.model_type = config.require<std::string>("model_type");
  m.context = options.context;
  m.kv_mode = std::string(kv_cache_mode_name(options.kv_mode));
  const std::vector<std::string> families = byte_model_families();
  if (std::find(families.begin(), families.end(), m.model_type) == families.end()) {
    std::string names;
    for (const auto& f : families) names += (names.empty() ? "" : ", ") + f;
    fail("{}: model_type '{}': the byte model knows {}", config.path().string(), m.model_type, names);
  }
  const WeightBytes w(config, options);
  m.weights = w.describe();
  Buckets b;
  if (m.model_type == "deepseek_v3") count_mla(config, w, options, m, b);
  else count_gqa(config, w, options, m, b);
  const std::pair<const char*, double> counted[] = {
      {"embedding_row", b.embedding_row}, {"attention", b.attention}, {"dense_mlp", b.dense_mlp},
      {"routed_experts", b.routed_experts}, {"shared_experts", b.shared_experts}, {"routers", b.routers},
      {"norms", b.norms}, {"lm_head", b.lm_head}, {"cache", b.cache}};
  double total = 0;
  for (const auto& [name, bytes] : counted) total += bytes;
  MERE_CHECK(total <= kMostBytesCounted,
             "{}: these sizes (with --context {}) give {:.3g} bytes a token, past the 2^53 the byte model counts",
             config.path().string(), options.context, total);
  for (const auto& [name, bytes] : counted) m.buckets.push_back({name, uint64_t(bytes)});
  return m;
}

}  // namespace mere
