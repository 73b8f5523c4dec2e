#include "models/blocks/attention_inputs.h"

#include <cmath>

namespace mere {

void rotate_and_cache(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                      float eps, const ops::RopeTable& rope, const Tensor& pos, KvCache& cache, bool fused) {
  if (fused) {
    ops::qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, rope, pos, cache.keys_for_write(),
                            cache.values_for_write());
    return;
  }
  Tensor kk = k;
  if (q_norm.defined()) {
    q = ops::rms_norm(q, q_norm, eps);
    kk = ops::rms_norm(k, k_norm, eps);
  }
  ops::rope(q, pos, rope);
  ops::rope(kk, pos, rope);
  cache.write(pos, kk, v);
}

Tensor attend_cached(Tensor q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                     float eps, const ops::RopeTable& rope, const Tensor& pos, SeqState& state, int layer,
                     bool fused_rope_store) {
  const int64_t T = q.shape()[0];
  const float scale = 1.0f / std::sqrt(float(q.shape()[2]));
  KvCache& cache = state.kv(layer);
  rotate_and_cache(q, k, v, q_norm, k_norm, eps, rope, pos, cache, fused_rope_store);
  Tensor a = cache.attention_reads_storage()  // else the CPU reads an f32 copy of the visible rows
                 ? ops::attention(q, cache.keys(), cache.values(), pos, scale)  // [T, n_heads, head_dim]
                 : ops::attention(q, cache.keys_for_attention(state.length() + T),
                                  cache.values_for_attention(state.length() + T), state.length(), scale);
  return a.reshape({T, -1});
}

}  // namespace mere
