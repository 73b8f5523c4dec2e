// What happens to a layer's new q, k, v before attention: per-head q/k RMSNorm
// (Qwen3, when the norms are defined), RoPE, and the K/V cache write; as one
// fused op or as the composition (lever fused_rope_store).
#pragma once

#include "ops/ops.h"
#include "state/kv_cache.h"

namespace mere {

// q [T, n_heads, head_dim] becomes the normalised, rotated queries; k and v
// [T, n_kv_heads, head_dim] end up (k normalised and rotated) in `cache` at *pos.
void rotate_and_cache(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                      float eps, const ops::RopeTable& rope, const Tensor& pos, KvCache& cache, bool fused);

// One layer's causal attention over its cache: the new q, k, v [T, heads,
// head_dim] go through rotate_and_cache into state.kv(layer), then each query
// attends to every cached position up to its own. Returns [T, n_heads * head_dim].
// Every family with standard (GQA) attention calls this; how the cache is laid
// out stays behind it.
Tensor attend_cached(Tensor q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                     float eps, const ops::RopeTable& rope, const Tensor& pos, SeqState& state, int layer,
                     bool fused_rope_store);

}  // namespace mere
