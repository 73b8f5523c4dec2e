// The op interface: every model forward is written against these functions.
// Activations are f32 on the CPU; weights may be f32, f16 or bf16 (converted on
// the fly, accumulation always in f32). Each op checks its arguments, then
// dispatches on the device to ops/cpu (the reference) or ops/cuda.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "ops/weight.h"

namespace mere::ops {

// Rows of `table` [vocab, d] gathered for `ids` -> [T, d] f32. Ids are range-checked.
Tensor embed(const Tensor& table, const std::vector<int32_t>& ids);

// The same, with the ids already on the table's device (i32 [T]); a CUDA graph
// captures this form, so a replay reads whatever id was written there.
Tensor embed(const Tensor& table, const Tensor& ids);

// RMSNorm over the last dim: x * rsqrt(mean(x^2) + eps) * w. x f32 [..., d], w [d].
Tensor rms_norm(const Tensor& x, const Tensor& w, float eps);

// y = x @ w^T (+ bias). x f32 [T, in], w [out, in], bias [out] or undefined -> [T, out] f32.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());
// The same for a weight of any kind (ops/weight.h): quantized weights run their
// own kernels (dequantize-dot on the CPU and in GPU decode).
Tensor linear(const Tensor& x, const Weight& w, const Tensor& bias = Tensor());
// Rows of a table of any kind gathered for `ids` (on the table's device) -> [T, d] f32.
Tensor embed(const Weight& table, const Tensor& ids);

// silu(gate) * up, elementwise; both f32 of the same shape.
Tensor silu_mul(const Tensor& gate, const Tensor& up);
// The same on a fused gate/up projection: gate_up [T, 2f] holds gate then up -> [T, f].
Tensor silu_mul_halves(const Tensor& gate_up);

// h += x, then RMSNorm of the new h with w: the residual add and the next norm
// in one pass. Bit-identical to add_inplace followed by rms_norm.
Tensor add_rms_norm(Tensor& h, const Tensor& x, const Tensor& w, float eps);

// The fused decode forms (lever fused_norm_matvec): RMSNorm, SwiGLU and the
// residual add folded into a matmul's input and output. On the GPU, for decode
// row counts, each is one matrix-vector kernel (dense weights), or the
// tensor-core affine or FP8 matvec with its input formed by its prepare kernel
// (MLX affine or FP8 weights, where that kernel applies); elsewhere they
// compose the ops above, which defines them.
// The most rows the fused forms below take as single kernels (the decode
// matvecs'); a model folds its norms only for steps this short, since longer
// ones compose kernels where add_rms_norm would have been one.
constexpr int64_t kMaxFusedRows = 8;
// Under lever sixteen_token_matvec the affine tensor-core forms take steps of
// up to this many rows too (a batch of 9-16 sequences).
constexpr int64_t kMaxWideFusedRows = 16;
// linear(rms_norm(h, norm_w, eps), w, bias).
Tensor rms_norm_linear(const Tensor& h, const Tensor& norm_w, float eps, const Weight& w,
                       const Tensor& bias = Tensor());
// h += linear(x, w, bias).
void linear_add(Tensor& h, const Tensor& x, const Weight& w, const Tensor& bias = Tensor());
// linear(silu_mul_halves(gate_up), w, bias). On the GPU, a prefill through dense
// bf16/f16 weights forms the activations in the weight's dtype at once (the
// values linear would convert them to), not in f32 first; so do MLX affine and
// FP8 weights where linear takes their bf16 copy (lever formed_gemm_input).
Tensor swiglu_linear(const Tensor& gate_up, const Weight& w, const Tensor& bias = Tensor());
// h += linear(silu_mul_halves(gate_up), w, bias).
void swiglu_linear_add(Tensor& h, const Tensor& gate_up, const Weight& w, const Tensor& bias = Tensor());
// Whether w's decode matvec of T rows (1 to kMaxFusedRows) runs on the tensor
// cores when lever tensor_core_affine_matvec (an MLX affine weight on the GPU)
// or tensor_core_fp8_matvec (an FP8 one) is on: where the fused forms above are
// single kernels. From 2 rows every supported matrix does; one row only a large
// one. formed_input: as one of those forms, whose prepare kernel replaces one
// that would run anyway, so smaller affine matrices pay at one row (FP8 ones
// measured no gain).
bool matvec_on_tensor_cores(const Weight& w, int64_t T, bool formed_input = false);
// Whether the fused forms above take T rows of w (past the decode matvecs') with
// their input formed on its way into cuBLAS, which adds into h (lever
// formed_gemm_input, as the levers stand): one kernel for the input and one
// GEMM, as linear's own conversion and GEMM are. bf16/f16 weights, and MLX
// affine and FP8 ones where linear takes their bf16 copy (past the dequantizing
// GEMM's tokens, or where it does not pay; FP8 not under fp8_activation_gemm).
bool gemm_forms_input(const Weight& w, int64_t T);

// pos (i32 [1], on any device) += by; on the GPU a kernel, so a CUDA graph's
// step can move its own position on.
void advance_position(Tensor& pos, int32_t by);
// The same, then the B tokens (i32 [B], on pos's device) are written to row
// (the new position % slots) of host_ring (i32 [slots, B]; on the GPU pinned host
// memory as the device addresses it, pinned_device_address): a graph's last kernel
// hands the host its tokens, with no copy between replays (lever kernel_token_slots).
void advance_position(Tensor& pos, int32_t by, const Tensor& tokens, int32_t* host_ring, int64_t slots);

// How CUDA kernels launch from now on (no effect on the CPU); a CUDA model sets
// this before it runs.
struct LaunchSettings {
  bool programmatic = false;    // lever programmatic_launch: start during the previous kernel's tail
  bool matvec_split_k = false;  // lever matvec_split_k: several warps per row when a matrix has few rows
  bool fp8_activation_gemm = false;  // lever fp8_activation_gemm: FP8 prefill with E4M3 activations
  bool int8_activation_matvec = false;  // lever int8_activation_matvec: affine decode matvecs on int8 x
  bool tensor_core_kv_attention = false;  // lever tensor_core_kv_attention: affine8/affine4 KV attention on mma
  bool tensor_core_attention = false;  // lever tensor_core_attention: long contexts' bf16/f16 KV attention on mma
  bool rope_in_attention = false;  // lever rope_in_attention: decode attention rotates and stores its new rows
  bool wide_attention_blocks = false;  // lever wide_attention_blocks: 8-warp attention blocks of fewer heads where they fit a wave
  bool cluster_attention_merge = false;  // lever cluster_attention_merge: those blocks' splits merge in clusters
  bool tensor_core_affine_matvec = false;  // lever tensor_core_affine_matvec: affine decode matvecs on mma
  // Lever int16_activation_matvec: those mma matvecs, from 2 tokens, take x rounded
  // to 15 bits per group (two base-256 digits, four tokens an mma) instead of 23.
  bool int16_activation_matvec = false;
  // Lever sixteen_token_matvec: those matvecs take steps of 9-16 rows too (two
  // digits), which the prefill GEMM takes otherwise.
  bool sixteen_token_matvec = false;
  // Lever sixteen_token_experts: the tensor-core affine MoE experts take steps of
  // 9-16 tokens too, which the grouped prefill GEMMs take otherwise.
  bool sixteen_token_experts = false;
  bool tensor_core_fp8_matvec = false;  // lever tensor_core_fp8_matvec: FP8 decode matvecs on mma
  bool tensor_core_moe_matvec = false;  // lever tensor_core_moe_matvec: affine MoE experts' decode on mma
  bool routing_in_experts = false;  // lever routing_in_experts: those experts' gate/up route each token themselves
  bool deep_moe_ring = false;  // lever deep_moe_ring: those experts' one-token int8 matvecs keep 5 stages in flight
  bool deep_dense_ring = false;  // lever deep_dense_ring: one-token int8 dense matvecs on mma keep 5 stages in flight
  bool wide_batch_stages = false;  // lever wide_batch_stages: 5-8-token int8 dense matvecs on mma read 256-byte stages
  bool uneven_row_cuts = false;  // lever uneven_row_cuts: a row no equal cut fits in launches, the last shorter
  bool int4_byte_codes = false;  // lever int4_byte_codes: int4 g64/g128 experts on mma take the stored bytes
  bool streamed_weights = false;  // lever streamed_weights: the decode matvecs' weights evict first from L2
  // Lever tensor_core_affine_gemm: affine prefill on the GEMM that dequantizes its
  // tiles, where it measured faster (auto), or at every size (on).
  bool tensor_core_affine_gemm = false;
  bool affine_gemm_at_every_size = false;
  // Lever tensor_core_affine_moe_gemm: MLX affine experts' prefill on that GEMM, grouped by expert.
  bool tensor_core_affine_moe_gemm = false;
  // Lever tensor_core_dense_moe_gemm: bf16 and FP8 experts' prefill on that grouped GEMM.
  bool tensor_core_dense_moe_gemm = false;
  // Lever tensor_core_fp8_gemm: FP8 prefill up to 256 tokens on that GEMM, the weights formed in registers.
  bool tensor_core_fp8_gemm = false;
  // Lever grouped_swiglu_epilogue: those grouped GEMMs' gate and up in one launch, SwiGLU in its epilogue.
  bool grouped_swiglu_epilogue = false;
  // Lever formed_gemm_input: cuBLAS's long steps take RMSNorm / SwiGLU formed on the way in and add into the residual.
  bool formed_gemm_input = false;
  // Lever split_sum_kernel: the dequantizing GEMM's split sums added by a kernel over every SM.
  bool split_sum_kernel = false;
};
void set_launch_settings(const LaunchSettings& settings);

// How the CPU's matmuls run from now on (no effect on CUDA); a CPU model sets
// this before it runs.
struct CpuSettings {
  bool direct_matvec = false;  // lever cpu_direct_matvec: decode matvecs convert the stored weights in registers
  bool tiled_matmul = false;   // lever cpu_tiled_matmul: prefill matmuls in register tiles
  bool vnni_matvec = false;    // lever cpu_vnni_matvec: affine decode matvecs as integer dot products
  bool vector_attention = false;  // lever cpu_vector_attention: attention in AVX2 registers, a task per tile
  bool avx512_matmul = false;     // lever cpu_avx512_matmul: the tiled prefill product in 512-bit registers
  bool packed_matmul = false;     // lever cpu_packed_matmul: that product as an outer product of packed tokens
  bool avx512_attention = false;  // lever cpu_avx512_attention: prefill attention tiles in 512-bit registers
};
void set_cpu_settings(const CpuSettings& settings);

// The key count each sequence sees in the decode step whose kernels are launched
// next (its new token included; 0: unknown, the default, as in prefill): a
// launcher may pick its form by it (lever wide_attention_blocks).
// decode_keys_range() then gives the key counts for which every launch since
// would have picked the same forms, so a CUDA graph captured of them serves
// every step in that range. No effect on the CPU.
struct KeyCountRange {
  int64_t lo = 1, hi = INT64_MAX;
  bool holds(int64_t keys) const { return lo <= keys && keys <= hi; }
};
void set_decode_keys(int64_t keys);
KeyCountRange decode_keys_range();
// Said by a decode step for the launches that follow (off unless said): its
// position tensor and the cache rows before that position were final before
// the step's first kernel started (a graph replay begins after the one before
// has ended; an eager step follows advance_position, which lets no kernel start
// before it ends). Attention then loads those rows before it waits for the
// kernel before it (lever programmatic_launch). No effect on the CPU.
void set_cached_rows_final(bool final);

// Column blocks of x [T, sum(widths)] as tensors [T, width]: views when T == 1
// (contiguous already), copies otherwise (on the GPU one launch, at most 4 parts).
std::vector<Tensor> split_columns(const Tensor& x, const std::vector<int64_t>& widths);

// Rows of several tensors of one dtype stacked: [sum(rows), ...], on `device`
// (default: the parts', which then must share one).
Tensor concat_rows(const std::vector<Tensor>& parts, std::optional<Device> device = {});

// h += x, elementwise, in place; both f32 of the same shape.
void add_inplace(Tensor& h, const Tensor& x);

// Rotary position embedding tables: the inverse frequencies of the rotated
// dims and the factor the cos/sin are scaled by (YaRN's attention factor).
struct RopeTable {
  std::vector<float> inv_freq;  // [rotary_dim / 2]
  float attention_factor = 1.0f;
  bool interleaved = false;     // pairs (2i, 2i+1) as GPT-J; otherwise halves (i, i + d/2) as Llama
  int rotary_dim() const { return int(inv_freq.size()) * 2; }
};

// Rotates x [T, n_heads, head_dim] in place; token t sits at positions[t].
// Only the first rotary_dim dims of each head are rotated.
void rope(Tensor& x, const std::vector<int32_t>& positions, const RopeTable& table);

// The same with the first token's position in device memory (i32 [1]): token t
// sits at *start_pos + t. For graph replay.
void rope(Tensor& x, const Tensor& start_pos, const RopeTable& table);

// Paged K/V (state/block_pool.h): a cache's storage is blocks of kKvPageRows
// rows, and position p of a sequence is storage row table[p / kKvPageRows] *
// kKvPageRows + p % kKvPageRows, with `table` the sequence's block ids (i32 on
// the cache's device, at least ceil(positions / kKvPageRows) entries). With one
// table the rows of q, k and v are tokens of that sequence at *start_pos + t;
// with B > 1 tables (same-offset batching) row b is the one new token of
// sequence b, every sequence at *start_pos. No tables: the cache is contiguous
// (position p is row p), as in the ops' forms without KvPages.
inline constexpr int64_t kKvPageRows = 16;
struct KvPages {
  std::vector<Tensor> tables;
  bool paged() const { return !tables.empty(); }
  bool per_sequence_rows() const { return tables.size() > 1; }
};

// Rows [0, n) of one sequence gathered from paged storage [rows, ...] (any
// dtype) through its table: a contiguous [n, ...] copy on the storage's device.
Tensor gather_pages(const Tensor& storage, const Tensor& table, int64_t n);
// Rows gather_pages has copied since the process began (for tests: a read in
// place copies none).
int64_t gathered_page_rows();

// Causal grouped-query attention for T new tokens at positions pos0 .. pos0+T-1
// over a cache holding every position 0 .. pos0+T-1.
// q [T, n_heads, head_dim]; k, v [>= pos0+T, n_kv_heads, head_dim] -> [T, n_heads, head_dim].
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale);
// The same with pos0 = *start_pos read on the device; k and v may hold more rows
// than are visible (a cache at full capacity). For graph replay.
// Paged (pages.paged(), CUDA only): k, v are the pool's storage; the split-K
// kernel reads each key's row through its sequence's table, one launch for
// every sequence of a batch.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& start_pos, float scale,
                 const KvPages& pages = {});
// Paged with the first position on the host (one sequence, any device): the
// visible rows gathered (gather_pages), then the contiguous op (a GPU prefill
// takes the tensor-core kernel).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale, const KvPages& pages);

// The attention inputs' epilogue fused: per-head RMSNorm of q and k (when q_norm
// and k_norm are defined, Qwen3), RoPE of both at *start_pos + t, then k and v
// written to the cache rows *start_pos .. + T - 1. q [T, n_heads, head_dim] is
// updated in place; k, v [T, n_kv_heads, head_dim]; caches [S, n_kv_heads, head_dim].
// Equals rms_norm, rope, rope, store_rows, store_rows (lever fused_rope_store).
// Paged caches (KvPages) get each row at its sequence's position.
void qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const RopeTable& rope, const Tensor& start_pos, Tensor& k_cache, Tensor& v_cache,
                        const KvPages& pages = {});

// dst rows [*start_pos, *start_pos + T) = src [T, ...] converted to dst's dtype;
// paged: the rows of those positions (of each row's sequence for a batch).
void store_rows(const Tensor& src, Tensor& dst, const Tensor& start_pos, const KvPages& pages = {});

// K or V rows stored as groupwise affine codes (KV cache modes affine8 and
// affine4): groups of kv_quant_group(head_dim) values along head_dim, each with a
// bf16 scale and bias, value = scale * code + bias.
//   codes  [rows, heads, head_dim * bits / 8] u8 (4 bits: two a byte, the first in the low nibble)
//   scales, biases [rows, heads, head_dim / group] bf16
struct AffineRows {
  Tensor codes, scales, biases;
  int bits = 0;
  int64_t rows() const { return codes.defined() ? codes.dim(0) : 0; }
  int64_t heads() const { return codes.dim(1); }
  int64_t head_dim() const { return codes.dim(2) * 8 / bits; }
  Device device() const { return codes.device(); }
};
inline constexpr int kKvQuantGroup = 64;  // elements per scale/bias group along head_dim
// The group for a head: 64, or the whole head when it is shorter.
inline int64_t kv_quant_group(int64_t head_dim) { return head_dim < kKvQuantGroup ? head_dim : kKvQuantGroup; }

// x [T, heads, head_dim] (f32, CPU) quantized to `bits` (8 or 4): the bias is
// the group minimum rounded down to bf16, the scale (max - bias) / levels
// rounded up, so each value comes back within half a step (scale / 2).
AffineRows quantize_kv_rows(const Tensor& x, int bits);
// Rows [0, n) back to f32 [n, heads, head_dim] (CPU).
Tensor dequantize_kv_rows(const AffineRows& q, int64_t n, int64_t head_dim);
// dst rows [*start_pos, *start_pos + T) = x [T, heads, head_dim] (f32) quantized
// as quantize_kv_rows does; on the GPU by a kernel (graph-replayable). Paged as
// the dense form.
void store_rows(const Tensor& x, AffineRows& dst, const Tensor& start_pos, const KvPages& pages = {});
// Rows [0, n) of src dequantized into dst [>= n, heads, head_dim] (f32 on the
// CPU, bf16 on the GPU), on src's device.
void dequantize_rows_into(const AffineRows& src, int64_t n, Tensor& dst);

// qk_norm_rope_store (above) into a quantized cache: the k and v rows are
// quantized as store_rows does (on the GPU inside the fused kernel).
void qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const RopeTable& rope, const Tensor& start_pos, AffineRows& k_cache,
                        AffineRows& v_cache, const KvPages& pages = {});

// Causal attention (as above) over a quantized cache. With the position on the
// device (graph replay) the GPU kernel reads the codes directly, dequantizing in
// registers, for any T. With a host pos0 the GPU takes the same kernel for few
// tokens, and for a prefill (T >= 16) dequantizes the visible rows to a bf16
// copy for the tensor-core kernel. The CPU dequantizes the visible rows.
// Paged as the dense forms: the device-position form reads the codes through
// the tables (CUDA), the host-position form gathers the visible rows first.
Tensor attention(const Tensor& q, const AffineRows& k, const AffineRows& v, const Tensor& start_pos, float scale,
                 const KvPages& pages = {});
Tensor attention(const Tensor& q, const AffineRows& k, const AffineRows& v, int64_t pos0, float scale);
Tensor attention(const Tensor& q, const AffineRows& k, const AffineRows& v, int64_t pos0, float scale,
                 const KvPages& pages);

// Split-K decode attention before its merge (CUDA): per split of the visible
// keys, each head's running max and sum of exp(score - max) and its output not
// yet divided by the sum. merge_attention gives what attention gives.
struct AttentionSplits {
  Tensor max, sum;  // f32 [T, n_heads, splits]
  Tensor out;       // f32 [T, n_heads, splits, head_dim]
  // Instead of the three above, where the splits merged in clusters (lever
  // cluster_attention_merge): the output, f32 [T, n_heads, head_dim].
  Tensor merged{};
  // The splits the launches wrote, at most out's (the wide grid's: the rest
  // are empty, and a merge need not read them); 0: all of them.
  int live = 0;
  // Said by the caller: it merges the partials with merge_attention (a kernel
  // of its own, not o_proj's prepare), so wider clusters that save it pay.
  bool merged_by_kernel = false;
};
// The graph forms of attention (position on the device, dense or quantized
// cache, paged or not) without the merge, where they run split-K on the GPU;
// false, with nothing run, where they do not (the CPU, or a dense cache's
// prefill, which the flash kernel takes).
bool attention_unmerged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& start_pos, float scale,
                        const KvPages& pages, AttentionSplits& out);
bool attention_unmerged(const Tensor& q, const AffineRows& k, const AffineRows& v, const Tensor& start_pos,
                        float scale, const KvPages& pages, AttentionSplits& out);
// qk_norm_rope_store into a dense cache, then attention_unmerged, as one kernel
// (lever rope_in_attention, CUDA): q, k, v as the qkv matmul left them, one new
// token per row (a decode step, or a batch's sequences at *start_pos); k and v
// written to the cache, q left as it was. The same partials and cache as the
// two ops. False, with nothing run, where it does not apply (the lever off, the
// CPU, a prefill, batches over 4 sequences, batches with groups of more than 4
// heads outside the 8-warp blocks of lever wide_attention_blocks, head_dim over
// 128, groups over 8 heads).
bool rope_in_attention_unmerged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                const Tensor& k_norm, float eps, const RopeTable& rope, const Tensor& start_pos,
                                Tensor& k_cache, Tensor& v_cache, float scale, const KvPages& pages,
                                AttentionSplits& out);
// The splits merged: [T, n_heads, head_dim] f32.
Tensor merge_attention(const AttentionSplits& splits);
// h += linear(merge_attention(splits) as [T, n_heads * head_dim], w, bias). The
// tensor-core affine matvec merges the splits as it forms its input, one kernel
// fewer (lever fused_norm_matvec).
void attention_linear_add(Tensor& h, const AttentionSplits& splits, const Weight& w, const Tensor& bias = Tensor());

// Fills t (f32/f16/bf16, CPU or GPU) with offset + scale * u, u uniform in [-1, 1),
// from a counter-based hash of (seed, index): the same values on every device.
void fill_random(Tensor& t, uint64_t seed, float scale, float offset = 0.0f);

// Fills t's bytes (any dtype, CPU or GPU) with counter-based random bytes ANDed
// with `mask`: packed integer codes and fp8 values for random-weight models.
void fill_random_bytes(Tensor& t, uint64_t seed, uint8_t mask);

// dst = src converted to dst's float dtype; same element count, same device.
void convert_into(const Tensor& src, Tensor& dst);

// Mixture of experts (ops/moe_ops.cpp).
// How a router's logits choose each token's experts.
struct MoeRouting {
  enum class Score { softmax, sigmoid };
  Score score = Score::softmax;      // over all experts (softmax) or each on its own (sigmoid)
  int top_k = 1;                     // experts per token
  bool renormalize = false;          // the k chosen weights divided by their sum (norm_topk_prob)
  float scale = 1.0f;                // every weight times this, last (routed_scaling_factor)
  // Expert groups (DeepSeek-V3): only experts of the top_groups groups with the
  // best group score (the sum of their two best scores) compete.
  int n_groups = 1, top_groups = 1;
};
// Each token's experts, best first (ties to the lower expert index), and their weights.
struct MoeChoice {
  Tensor ids;      // i32 [T, k]
  Tensor weights;  // f32 [T, k]
};
// logits f32 [T, n_experts]; `correction` (f32 [n_experts] or undefined) is
// added to the scores for choosing only, never to the weights (DeepSeek-V3's
// e_score_correction_bias).
MoeChoice moe_route(const Tensor& logits, const MoeRouting& routing, const Tensor& correction = Tensor());

// One MoE layer's experts, stacked so expert e owns rows [e * n, (e + 1) * n)
// of each matrix with n rows per expert.
struct ExpertWeights {
  Weight gate, up;  // [n_experts * d_ff, d_model] each; undefined when fused
  Weight gate_up;   // fused: [n_experts * 2 * d_ff, d_model], expert e's gate rows, then its up rows
  Weight down;      // [n_experts * d_model, d_ff]
  int64_t n_experts = 0, d_ff = 0, d_model = 0;
  bool fused() const { return gate_up.defined(); }
  uint64_t size_bytes() const;
  // Expert e's matrices as plain weights [d_ff, d_model] / [d_model, d_ff].
  Weight gate_of(int64_t e) const;
  Weight up_of(int64_t e) const;
  Weight down_of(int64_t e) const;
};
// out[t] = sum_j weights[t, j] * down_e(silu(gate_e x[t]) * up_e x[t]), e = ids[t, j].
// x f32 [T, d_model] -> [T, d_model] f32. Tokens routed to one expert read its weights once.
Tensor moe_experts(const Tensor& x, const ExpertWeights& experts, const MoeChoice& choice);
// moe_experts(x, experts, moe_route(logits, routing, correction)) as one op: on
// the GPU under lever routing_in_experts the tensor-core experts' first matvec
// routes each token itself (the same choice), one launch fewer.
Tensor moe_routed_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& logits,
                          const MoeRouting& routing, const Tensor& correction = Tensor());
// h += moe_routed_experts(...): on the GPU the tensor-core affine experts' down
// matvec adds into h itself (the same sums, no add kernel).
void moe_routed_experts_add(Tensor& h, const Tensor& x, const ExpertWeights& experts, const Tensor& logits,
                            const MoeRouting& routing, const Tensor& correction = Tensor());
// h += moe_routed_experts(x, experts, x router^T, ...) with x = RMSNorm(h) norm_w
// (lever fused_norm_matvec): on the GPU, for affine routers and the tensor-core
// affine experts, the router's matvec and the experts' first kernel each
// normalize h themselves, and no kernel writes x (the sums may differ in the
// last bits from the composition's).
void moe_normed_experts_add(Tensor& h, const Tensor& norm_w, float eps, const Weight& router,
                            const ExpertWeights& experts, const MoeRouting& routing,
                            const Tensor& correction = Tensor());
// out[t] += y[t] * sigmoid(gate[t]) (a shared expert's gate; gate f32 [T, 1]),
// or out += y when gate is undefined. out, y f32 [T, d].
void add_gated(Tensor& out, const Tensor& y, const Tensor& gate);

}  // namespace mere::ops
