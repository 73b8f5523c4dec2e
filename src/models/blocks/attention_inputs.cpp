#include "models/blocks/attention_inputs.h"

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

}  // namespace mere
