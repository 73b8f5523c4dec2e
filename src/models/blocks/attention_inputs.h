// What happens to a layer's new q, k, v before attention: per-head q/k RMSNorm
// (Qwen3, when the norms are defined), RoPE, and the K/V cache write; as one
// fused op or as the composition (lever fused_rope_store).
#pragma once

#include <span>

#include "ops/ops.h"
#include "state/seq_state.h"

namespace mere {

// q [T, n_heads, head_dim] becomes the normalised, rotated queries; k and v
// [T, n_kv_heads, head_dim] end up (k normalised and rotated) in the layer's
// K/V at *pos. Fused: one kernel writing the layer's storage (dense or
// quantized, paged or contiguous; on the CPU the fused op is the composition).
void rotate_and_cache(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                      float eps, const ops::RopeTable& rope, const Tensor& pos, SeqState& state, int layer,
                      bool fused);

// One layer's causal attention over its cache: the new q, k, v [T, heads,
// head_dim] go through rotate_and_cache into the layer's K/V, then each query
// attends to every cached position up to its own. Returns [T, n_heads * head_dim].
// Every family with standard (GQA) attention calls this; how the cache is laid
// out stays behind it.
//
// With several states (same-offset batching) row b of q, k, v is one new token of
// states[b], every sequence at position *pos; each attends to its own cache.
// States paged on one pool take one K/V write and one attention launch for the
// whole batch (each sequence through its own block table); others, one per sequence.
//
// With `unmerged` set, a split-K attention on the GPU (decode) leaves its
// partials there unmerged and returns an undefined tensor, for a caller that
// merges them on the way into o_proj (ops::attention_linear_add).
//
// Fused, a decode step over a dense GPU cache runs the rotation and the cache
// write inside the attention kernel when lever rope_in_attention is on
// (ops::rope_in_attention_unmerged); q is then left unrotated.
Tensor attend_cached(Tensor q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                     float eps, const ops::RopeTable& rope, const Tensor& pos, std::span<SeqState* const> states,
                     int layer, bool fused_rope_store, ops::AttentionSplits* unmerged = nullptr);

// The rows of the final hidden state whose logits a step returns: one per
// sequence for a batch, else the last token's, or every token's with all_logits.
Tensor logit_rows(const Tensor& x, std::span<SeqState* const> states, bool all_logits);

}  // namespace mere
