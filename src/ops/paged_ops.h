// The paged forms of the K/V ops (ops.h KvPages): their checks, the CPU
// reference (each sequence's rows gathered, then the contiguous op), and the
// dispatch to the CUDA kernels, which read the block tables themselves.
// ops.cpp calls these when its KvPages argument is paged.
#pragma once

#include "ops/ops.h"

namespace mere::ops::paged {

void store_rows(const Tensor& src, Tensor& dst, const Tensor& start_pos, const KvPages& pages);
void store_rows(const Tensor& x, AffineRows& dst, const Tensor& start_pos, const KvPages& pages);
void qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const RopeTable& rope, const Tensor& start_pos, Tensor& k_cache, Tensor& v_cache,
                        const KvPages& pages);
void qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const RopeTable& rope, const Tensor& start_pos, AffineRows& k_cache,
                        AffineRows& v_cache, const KvPages& pages);
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& start_pos, float scale,
                 const KvPages& pages);
Tensor attention(const Tensor& q, const AffineRows& k, const AffineRows& v, const Tensor& start_pos, float scale,
                 const KvPages& pages);
bool attention_unmerged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& start_pos, float scale,
                        const KvPages& pages, AttentionSplits& out);
bool attention_unmerged(const Tensor& q, const AffineRows& k, const AffineRows& v, const Tensor& start_pos,
                        float scale, const KvPages& pages, AttentionSplits& out);

bool rope_in_attention_unmerged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                const Tensor& k_norm, float eps, const RopeTable& rope, const Tensor& start_pos,
                                Tensor& k_cache, Tensor& v_cache, float scale, const KvPages& pages,
                                AttentionSplits& out);

}  // namespace mere::ops::paged
