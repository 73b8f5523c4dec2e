// The CUDA implementations behind ops.h. Arguments are already checked; every
// launch goes on mere::cuda::stream() and is checked with MERE_CUDA_LAUNCHED.
#pragma once

#include "ops/cuda/mma_input.h"
#include "ops/ops.h"

namespace mere::ops::cuda {

void embed(const Tensor& table, const std::vector<int32_t>& ids, Tensor& out);
void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out);
void linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out);
void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out);
void add_inplace(Tensor& h, const Tensor& x);
void silu_mul_halves(const Tensor& gate_up, Tensor& out);
// x [T, n] into parts [T, w_i]: its column blocks in order (the widths sum to n).
void split_columns(const Tensor& x, std::vector<Tensor>& parts);  // at most 4 parts, one launch
void add_rms_norm(Tensor& h, const Tensor& x, const Tensor& w, float eps, Tensor& out);
// The fused decode forms (ops.h), and past the decode matvec's rows their
// prefill forms under lever formed_gemm_input (formed_dense_linear below); each
// returns false where neither applies (unaligned rows, a norm weight of another
// dtype than w at decode), and the caller composes the plain ops instead.
bool rms_norm_linear(const Tensor& h, const Tensor& norm_w, float eps, const Tensor& w, const Tensor& bias,
                     Tensor& out);
bool linear_add(Tensor& h, const Tensor& x, const Tensor& w, const Tensor& bias);
bool swiglu_linear_add(Tensor& h, const Tensor& gate_up, const Tensor& w, const Tensor& bias);
// The prefill's swiglu_linear (ops.h): false where the decode matvec applies or
// w is not bf16/f16 (the GEMM takes f32 x as it is).
bool swiglu_linear(const Tensor& gate_up, const Tensor& w, const Tensor& bias, Tensor& out);
// Lever formed_gemm_input through dense bf16/f16 weights (a prefill, past the
// decode matvec's rows; an MLX affine or FP8 weight's bf16 copy past its own
// GEMM's): x formed in w's dtype at once (RMSNorm(h), SwiGLU or x converted: the
// values the f32 forms then linear's conversion store), then the GEMM, adding
// into y with accumulate (cuBLAS's beta 1). false, with nothing run, for other
// weights and rows, or a bias with accumulate (y + (product + bias) is two adds).
bool dense_gemm_forms_input(const Tensor& w, int64_t T);
bool formed_dense_linear(const mere::cuda::MmaInput& input, int64_t T, const Tensor& w, const Tensor& bias, float* y,
                         bool accumulate);
void advance_position(Tensor& pos, int32_t by);
void advance_position(Tensor& pos, int32_t by, const Tensor& tokens, int32_t* host_ring, int64_t slots);
void set_launch_settings(const LaunchSettings& settings);
void set_decode_keys(int64_t keys);
void set_cached_rows_final(bool final);
KeyCountRange decode_keys_range();
void fill_random_bytes(Tensor& t, uint64_t seed, uint8_t mask);

void rope(Tensor& x, const std::vector<int32_t>& positions, const RopeTable& table);
void attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale, Tensor& out);
void convert(const Tensor& src, Tensor& dst);
// Graph-replayable forms: positions and ids read from device memory.
void embed(const Tensor& table, const Tensor& ids, Tensor& out);
void rope(Tensor& x, const Tensor& start_pos, const RopeTable& table);
// Paged forms (KvPages, tables checked): the kernels read the block tables.
void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& start_pos, float scale, Tensor& out,
               const KvPages& pages = {});
void store_rows(const Tensor& src, Tensor& dst, const Tensor& start_pos, const KvPages& pages = {});
void qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const RopeTable& rope, const Tensor& start_pos, Tensor& k_cache, Tensor& v_cache,
                        const KvPages& pages = {});
void gather_pages(const Tensor& storage, const Tensor& table, int64_t n, Tensor& out);
void fill_random(Tensor& t, uint64_t seed, float scale, float offset);

// Mixture of experts (ops.h), arguments checked and outputs allocated.
void moe_route(const Tensor& logits, const MoeRouting& routing, const Tensor& correction, MoeChoice& choice);
void moe_experts(const Tensor& x, const ExpertWeights& experts, const MoeChoice& choice, Tensor& out);
void moe_routed_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& logits, const MoeRouting& routing,
                        const Tensor& correction, MoeChoice& choice, Tensor& out);
// h += the experts where the tensor-core affine experts run (their down adds
// into h); false, having launched nothing, elsewhere.
bool moe_routed_experts_add(Tensor& h, const Tensor& x, const ExpertWeights& experts, const Tensor& logits,
                            const MoeRouting& routing, const Tensor& correction, MoeChoice& choice);
// The same from h, RMSNorm'd for the router (by its CUDA-core matvec at one
// token, its tensor-core prepare kernel at 2-4) and by the experts' first
// kernel (ops.h moe_normed_experts_add); false, having launched
// nothing, where the router is not affine, the experts not on the tensor cores,
// or 5 or more tokens take the router's tensor cores.
bool moe_normed_experts_add(Tensor& h, const Tensor& norm_w, float eps, const Weight& router,
                            const ExpertWeights& experts, Tensor& logits, const MoeRouting& routing,
                            const Tensor& correction, MoeChoice& choice);
void add_gated(Tensor& out, const Tensor& y, const Tensor& gate);
// Quantized (affine) K/V caches. Below this many new tokens attention reads the
// codes directly; from it on (prefill) it reads a bf16 copy of the visible rows.
constexpr int64_t kQuantizedPrefillMinTokens = 16;
void store_rows(const Tensor& x, AffineRows& dst, const Tensor& start_pos, const KvPages& pages = {});
void dequantize_rows(const AffineRows& src, int64_t n, Tensor& dst);
void attention(const Tensor& q, const AffineRows& k, const AffineRows& v, const Tensor& start_pos, float scale,
               Tensor& out, const KvPages& pages = {});
void attention(const Tensor& q, const AffineRows& k, const AffineRows& v, int64_t pos0, float scale, Tensor& out);
// The split-K graph forms without their merge (ops.h attention_unmerged); false,
// with nothing run, for a prefill the flash kernel takes.
bool attention_unmerged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& start_pos, float scale,
                        const KvPages& pages, AttentionSplits& out);
bool attention_unmerged(const Tensor& q, const AffineRows& k, const AffineRows& v, const Tensor& start_pos,
                        float scale, const KvPages& pages, AttentionSplits& out);
void merge_attention(const AttentionSplits& splits, Tensor& out);
// ops.h rope_in_attention_unmerged: false, with nothing run, where the lever is
// off or the kernel does not apply.
bool rope_in_attention_unmerged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                const Tensor& k_norm, float eps, const RopeTable& rope, const Tensor& start_pos,
                                Tensor& k_cache, Tensor& v_cache, float scale, const KvPages& pages,
                                AttentionSplits& out);
void qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const RopeTable& rope, const Tensor& start_pos, AffineRows& k_cache,
                        AffineRows& v_cache, const KvPages& pages = {});

}  // namespace mere::ops::cuda
