#include "models/blocks/attention_inputs.h"

#include <cmath>

namespace mere {

void rotate_and_cache(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                      float eps, const ops::RopeTable& rope, const Tensor& pos, SeqState& state, int layer,
                      bool fused) {
  KvCache* cache = fused ? state.contiguous_kv(layer) : nullptr;
  if (cache && cache->quantized()) {
    ops::qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, rope, pos, cache->quantized_keys_for_write(),
                            cache->quantized_values_for_write());
    return;
  }
  if (cache) {
    ops::qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, rope, pos, cache->keys_for_write(),
                            cache->values_for_write());
    return;
  }
  Tensor kk = k;
  if (q_norm.defined()) {
    q = ops::rms_norm(q, q_norm, eps);
    kk = ops::rms_norm(k, k_norm, eps);
  }
  ops::rope(q, pos, rope);
  ops::rope(kk, pos, rope);
  state.write_kv(layer, pos, kk, v);
}

Tensor attend_cached(Tensor q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                     float eps, const ops::RopeTable& rope, const Tensor& pos, SeqState& state, int layer,
                     bool fused_rope_store) {
  const int64_t T = q.shape()[0];
  const float scale = 1.0f / std::sqrt(float(q.shape()[2]));
  rotate_and_cache(q, k, v, q_norm, k_norm, eps, rope, pos, state, layer, fused_rope_store);
  Tensor a = state.attend(layer, q, pos, scale);  // [T, n_heads, head_dim]
  return a.reshape({T, -1});
}

}  // namespace mere
