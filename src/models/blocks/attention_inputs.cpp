#include "models/blocks/attention_inputs.h"

#include <cmath>

namespace mere {

namespace {

// The per-head norms and RoPE of the unfused path. A batch's rows are
// sequences at one position: rotated as one token holding every row's heads.
void norm_and_rotate(Tensor& q, Tensor& k, const Tensor& q_norm, const Tensor& k_norm, float eps,
                     const ops::RopeTable& rope, const Tensor& pos, bool rows_are_sequences) {
  if (q_norm.defined()) {
    q = ops::rms_norm(q, q_norm, eps);
    k = ops::rms_norm(k, k_norm, eps);
  }
  for (Tensor* x : {&q, &k}) {
    Tensor view = rows_are_sequences ? x->reshape({1, -1, x->dim(2)}) : *x;
    ops::rope(view, pos, rope);
  }
}

// rotate_and_cache for the rows of `pages` (one sequence's tokens, or a batch's
// sequences) in `cache`.
void rotate_and_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                      float eps, const ops::RopeTable& rope, const Tensor& pos, KvCache& cache,
                      const ops::KvPages& pages, bool fused) {
  if (fused && cache.quantized()) {
    ops::qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, rope, pos, cache.quantized_keys_for_write(),
                            cache.quantized_values_for_write(), pages);
  } else if (fused) {
    ops::qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, rope, pos, cache.keys_for_write(), cache.values_for_write(),
                            pages);
  } else {
    Tensor kk = k;  // rotated in place, as the single-sequence path does
    norm_and_rotate(q, kk, q_norm, k_norm, eps, rope, pos, pages.per_sequence_rows());
    cache.write(pos, kk, v, pages);
  }
}

// Whether a batch's attention can run as one launch over all of it: paged
// states on one pool (one storage; each sequence's own table).
bool shares_one_pool(std::span<SeqState* const> states) {
  for (SeqState* s : states)
    if (!s->is_paged() || s->pool() != states.front()->pool()) return false;
  return true;
}

}  // namespace

void rotate_and_cache(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                      float eps, const ops::RopeTable& rope, const Tensor& pos, SeqState& state, int layer,
                      bool fused) {
  if (fused)
    return rotate_and_store(q, k, v, q_norm, k_norm, eps, rope, pos, state.storage(layer), state.pages(), true);
  Tensor kk = k;
  norm_and_rotate(q, kk, q_norm, k_norm, eps, rope, pos, false);
  state.write_kv(layer, pos, kk, v);
}

Tensor attend_cached(Tensor q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                     float eps, const ops::RopeTable& rope, const Tensor& pos, std::span<SeqState* const> states,
                     int layer, bool fused_rope_store, ops::AttentionSplits* unmerged) {
  const int64_t T = q.shape()[0];
  const float scale = 1.0f / std::sqrt(float(q.shape()[2]));
  // Lever rope_in_attention: the fused rotation and K/V write done by the decode
  // attention kernel itself, where it applies (a dense cache on the GPU, one new
  // token a row); false, with nothing run, elsewhere.
  auto in_attention = [&](KvCache& cache, const ops::KvPages& pages, Tensor& result) {
    if (!fused_rope_store || cache.quantized()) return false;
    ops::AttentionSplits own;
    own.merged_by_kernel = true;  // merge_attention below
    ops::AttentionSplits& splits = unmerged ? *unmerged : own;
    if (!ops::rope_in_attention_unmerged(q, k, v, q_norm, k_norm, eps, rope, pos, cache.keys_for_write(),
                                         cache.values_for_write(), scale, pages, splits))
      return false;
    result = unmerged ? Tensor() : ops::merge_attention(splits).reshape({T, -1});
    return true;
  };
  Tensor result;
  if (states.size() > 1) {  // one token per sequence, each against its own cache
    MERE_CHECK(int64_t(states.size()) == T, "attend_cached: {} rows for a batch of {} sequences", T, states.size());
    if (shares_one_pool(states)) {  // one write and one attention launch for the whole batch
      ops::KvPages pages;
      for (SeqState* s : states) pages.tables.push_back(s->pages().tables.front());
      KvCache& cache = states.front()->storage(layer);
      if (in_attention(cache, pages, result)) return result;
      rotate_and_store(q, k, v, q_norm, k_norm, eps, rope, pos, cache, pages, fused_rope_store);
      if (unmerged && cache.attend_unmerged(q, pos, scale, pages, *unmerged)) return Tensor();
      return cache.attend(q, pos, states.front()->length(), scale, pages).reshape({T, -1});
    }
    Tensor out = Tensor::empty({T, q.dim(1) * q.dim(2)}, DType::f32, q.device());
    for (int64_t b = 0; b < T; ++b) {
      Tensor row = out.slice_rows(b, b + 1);  // written on the device's stream (no host copy, no sync)
      ops::convert_into(attend_cached(q.slice_rows(b, b + 1), k.slice_rows(b, b + 1), v.slice_rows(b, b + 1), q_norm,
                                      k_norm, eps, rope, pos, states.subspan(size_t(b), 1), layer, fused_rope_store),
                        row);
    }
    return out;
  }
  SeqState& state = *states.front();
  if (in_attention(state.storage(layer), state.pages(), result)) return result;
  rotate_and_cache(q, k, v, q_norm, k_norm, eps, rope, pos, state, layer, fused_rope_store);
  if (unmerged && state.attend_unmerged(layer, q, pos, scale, *unmerged)) return Tensor();
  Tensor a = state.attend(layer, q, pos, scale);  // [T, n_heads, head_dim]
  return a.reshape({T, -1});
}

Tensor logit_rows(const Tensor& x, std::span<SeqState* const> states, bool all_logits) {
  if (states.size() > 1 || all_logits) return x;
  return x.slice_rows(x.dim(0) - 1, x.dim(0));
}

}  // namespace mere
