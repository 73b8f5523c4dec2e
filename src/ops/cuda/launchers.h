// Kernel launchers of the CUDA backend: raw pointers, sizes and a stream, no
// Tensor and no {fmt} (nvcc compiles only the .cu files that define these).
// Each returns the launch's cudaError_t; cuda_ops.cpp checks it.
// Weight and cache element types are passed as DType (f32, f16 or bf16).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace mere::cuda {

cudaError_t launch_embed(const void* table, DType table_dtype, const int32_t* ids, int64_t T, int64_t d, float* out,
                         cudaStream_t stream);
cudaError_t launch_rms_norm(const float* x, const void* w, DType w_dtype, float* y, int64_t rows, int64_t d,
                            float eps, cudaStream_t stream);
// The same with y of y_dtype (f32, bf16, f16): each value launch_rms_norm's, rounded once.
cudaError_t launch_rms_norm_as(const float* x, const void* w, DType w_dtype, void* y, DType y_dtype, int64_t rows,
                               int64_t d, float eps, cudaStream_t stream);
// Kernels launched while this is on may overlap the previous kernel's tail
// (programmatic dependent launch; lever programmatic_launch). Off by default.
void set_programmatic_launch(bool on);
// Decode matvecs with few rows share each row among up to 4 warps (lever
// matvec_split_k), so the grid fills the GPU. Off by default.
void set_matvec_split_k(bool on);
// FP8 weights' prefill on FP8 tensor cores with activations quantized to E4M3 per
// token and 128 columns (lever fp8_activation_gemm); off: dequantize to bf16 and
// use the bf16 GEMM.
void set_fp8_activation_gemm(bool on);
bool fp8_activation_gemm_enabled();
// MLX affine decode matvecs quantize x to int8 per 32 values and use dp4a (lever
// int8_activation_matvec); off: f32 x. Off by default.
void set_int8_activation_matvec(bool on);
bool int8_activation_matvec_enabled();
// Decode attention over affine8/affine4 caches on the tensor cores (lever
// tensor_core_kv_attention, attention_affine_mma.cu); off: the CUDA-core kernel.
void set_tensor_core_kv_attention(bool on);
bool tensor_core_kv_attention_enabled();
// Decode attention over dense bf16/f16 caches on the tensor cores where the
// CUDA-core kernel's 4-warp form would run (lever tensor_core_attention,
// attention_mma.cu); off: the CUDA-core kernel.
void set_tensor_core_attention(bool on);
bool tensor_core_attention_enabled();
// Decode attention over a dense cache rotates its own q and new key and writes
// the new K/V row (lever rope_in_attention, launch_rope_in_attention); off: the
// rope/store kernel first. Off unless set.
void set_rope_in_attention(bool on);
bool rope_in_attention_enabled();
// The GQA decode kernel in blocks of 8 warps of the fewest heads whose blocks
// with keys to walk fit one wave (lever wide_attention_blocks, attention.cu);
// off: 4 warps always.
void set_wide_attention_blocks(bool on);
bool wide_attention_blocks_enabled();
// Where those 8-warp blocks run over at most 2 splits (4 for one row whose
// partials would take the merge kernel), the splits of a head merge in a
// cluster through distributed shared memory and write the output themselves,
// no merge kernel (lever cluster_attention_merge, attention.cu).
void set_cluster_attention_merge(bool on);
bool cluster_attention_merge_enabled();
// The key count a sequence sees in the decode step launched next (0: unknown,
// as in prefill), and the key counts over which the launches since it was set
// keep their form (ops::set_decode_keys): a launcher whose form depends on the
// context narrows the range to the counts that would choose the same.
void set_decode_keys(int64_t keys);
int64_t decode_keys();
// Said by a decode step for its launches (ops::set_cached_rows_final): the
// position tensor and the cache rows before it were final before the step's
// first kernel started, so attention may load them before its wait.
void set_cached_rows_final(bool final);
bool cached_rows_final();
void narrow_decode_keys_range(int64_t lo, int64_t hi);
void decode_keys_range(int64_t& lo, int64_t& hi);
// MLX affine decode matvecs (T <= 8) on the tensor cores (lever
// tensor_core_affine_matvec, affine_matvec_mma.cu); off: the CUDA-core kernels.
void set_tensor_core_affine_matvec(bool on);
// Lever deep_dense_ring: that matvec at one token of int8 weights keeps five
// ring stages a warp in flight instead of three (affine_matvec_mma.cu).
void set_deep_dense_ring(bool on);
// Lever wide_batch_stages: that matvec at 5-8 tokens of int8 weights reads 256
// bytes of each row a stage instead of 128 where its blocks an SM stay
// (affine_matvec_mma.cu).
void set_wide_batch_stages(bool on);
// Lever uneven_row_cuts: that matvec cuts a row that no equal cut into at most
// 8 launches fits into launches of the same size but a shorter last one
// (affine_matvec_mma.cu).
void set_uneven_row_cuts(bool on);
// Lever int4_byte_codes: the tensor-core MoE experts' int4 stacks in groups of
// 64 or 128 take the stored bytes as the mma's operand, against x written as y
// and z (affine_matvec_mma.cu).
void set_int4_byte_codes(bool on);
bool int4_byte_codes_enabled();
// The tensor-core decode matvecs (affine and FP8) take one token only of a
// matrix this large: a smaller one pays more for their extra launch, which
// converts x, than it gains (docs/levers.md).
constexpr int64_t kMinTensorCoreWeightsAtOneToken = int64_t(1) << 24;
// Those tensor-core matvecs round x of 2 tokens or more to 15 bits per group,
// two base-256 digits (lever int16_activation_matvec); off, and for one token:
// 23 bits, three digits. Off unless set.
void set_int16_activation_matvec(bool on);
bool int16_activation_matvec_enabled();
// Lever sixteen_token_matvec: the tensor-core affine matvec (two digits of x)
// takes steps of 9 to kMaxTensorCoreMatvecTokens tokens too, which the prefill
// GEMM takes otherwise (batched decode of 9-16 sequences). Off unless set.
constexpr int kMaxTensorCoreMatvecTokens = 16;
void set_sixteen_token_matvec(bool on);
bool sixteen_token_matvec_enabled();
// Lever sixteen_token_experts: the tensor-core affine MoE experts take steps of
// 9 to kMaxTensorCoreMatvecTokens tokens too, which the grouped prefill GEMMs
// take otherwise (moe_ops.cpp). Off unless set.
void set_sixteen_token_experts(bool on);
bool sixteen_token_experts_enabled();
// FP8 decode matvecs on the tensor cores (lever tensor_core_fp8_matvec,
// fp8_matvec_mma.cu); off: the CUDA-core kernel. Off unless set.
void set_tensor_core_fp8_matvec(bool on);
bool tensor_core_fp8_matvec_enabled();
// MLX affine MoE experts' decode on the tensor cores (lever tensor_core_moe_matvec,
// launch_moe_experts_mma); off: the CUDA-core kernels. Off unless set.
void set_tensor_core_moe_matvec(bool on);
bool tensor_core_moe_matvec_enabled();
// The tensor-core experts' (affine and FP8) gate/up blocks route each token
// themselves (lever routing_in_experts, ops::moe_routed_experts); off: the
// routing kernel. Off unless set.
void set_routing_in_experts(bool on);
bool routing_in_experts_enabled();
bool tensor_core_affine_matvec_enabled();
// MLX affine prefill on the GEMM that dequantizes its tiles (lever
// tensor_core_affine_gemm, affine_gemm.cu): where affine_ops.cpp measured it
// faster, or at every size; off: a bf16 copy of the weight, then the dense GEMM.
void set_tensor_core_affine_gemm(bool on, bool every_size);
bool tensor_core_affine_gemm_enabled();
bool affine_gemm_at_every_size();
// The MoE experts' prefill of MLX affine experts on that GEMM grouped by expert
// (lever tensor_core_affine_moe_gemm, moe.cu); off: the WMMA grouped GEMM that
// dequantizes its tiles into shared memory. Off unless set.
void set_tensor_core_affine_moe_gemm(bool on);
bool tensor_core_affine_moe_gemm_enabled();
// bf16 and FP8 experts' prefill on that grouped GEMM (lever
// tensor_core_dense_moe_gemm, moe.cu); off: the WMMA grouped GEMM. Off unless set.
void set_tensor_core_dense_moe_gemm(bool on);
bool tensor_core_dense_moe_gemm_enabled();
// FP8 prefill of up to 256 tokens on that GEMM, the bf16 weights formed in
// registers (lever tensor_core_fp8_gemm, fp8_ops.cpp); off: a bf16 copy of the
// weight, then the dense GEMM. Off unless set.
void set_tensor_core_fp8_gemm(bool on);
bool tensor_core_fp8_gemm_enabled();
// Those grouped GEMMs' gate and up as one launch with SwiGLU in its epilogue
// (lever grouped_swiglu_epilogue, moe.cu); off: two launches into f32 and the
// SwiGLU kernel. Off unless set.
void set_grouped_swiglu_epilogue(bool on);
bool grouped_swiglu_epilogue_enabled();
// cuBLAS prefill GEMMs take their input formed from RMSNorm or SwiGLU on its
// way in and add into the residual (lever formed_gemm_input, cuda_ops.cpp
// formed_dense_linear); off: the norm, add and conversion kernels around
// them. Off unless set.
void set_formed_gemm_input(bool on);
bool formed_gemm_input_enabled();
// The dequantizing GEMM's split sums (three splits or more) added by a kernel of
// their own over every SM (lever split_sum_kernel, affine_gemm.cu); off: the last
// split of each tile adds them. Off unless set.
void set_split_sum_kernel(bool on);
bool split_sum_kernel_enabled();

// y[T, out] = x'[T, in] w[out, in]^T (+ bias[out]), x' the input as `input` forms
// it; T <= kMaxMatvecTokens, rows 16-byte aligned (in * sizeof(w) % 16 == 0).
constexpr int kMaxMatvecTokens = 8;
enum class MatvecInput {
  plain,       // x' = x [T, in]
  rms_normed,  // x' = RMSNorm(x) * norm_w: x is the residual [T, in], norm_w [in] of w's dtype
  silu_gated,  // x' = silu(x[:, :in]) * x[:, in:]: x is a fused gate/up output [T, 2 in]
};
// Lever streamed_weights: the decode matvecs (affine on the tensor cores and
// the CUDA cores, FP8 on the tensor cores, bf16/f16/f32) read their weights
// with an L2 evict-first cache hint, else without a hint.
void set_streamed_weights(bool on);
bool streamed_weights_enabled();

struct MatvecArgs {
  const float* x = nullptr;
  const void* w = nullptr;
  DType w_dtype = DType::bf16;
  const float* bias = nullptr;  // [out] or null
  float* y = nullptr;
  int64_t T = 1, in = 0, out = 0;
  MatvecInput input = MatvecInput::plain;
  const void* norm_w = nullptr;
  float eps = 0;
  bool accumulate = false;  // y += result (the residual add) instead of y = result
  bool streamed_weights = false;  // set by launch_matvec (lever streamed_weights)
};
cudaError_t launch_matvec(const MatvecArgs& args, cudaStream_t stream);
// *pos += by: the decode position moves on inside a CUDA graph.
cudaError_t launch_advance_position(int32_t* pos, int32_t by, cudaStream_t stream);
// The same, and tokens[0, B) to ring row (new *pos % slots): ring is pinned host
// memory (its device address), read by the host once the step's event has passed.
cudaError_t launch_advance_position_and_publish(int32_t* pos, int32_t by, const int32_t* tokens, int32_t* ring,
                                                int32_t B, int32_t slots, cudaStream_t stream);
cudaError_t launch_add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);
cudaError_t launch_silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
cudaError_t launch_add(float* h, const float* x, int64_t n, cudaStream_t stream);
// gate_up [T, 2f] -> out [T, f] = silu(gate) * up.
// out [T, f] (f32, bf16 or f16) = silu(gate_up[:, :f]) * gate_up[:, f:], formed in f32.
cudaError_t launch_silu_mul_halves(const float* gate_up, void* out, DType out_dtype, int64_t T, int64_t f,
                                   cudaStream_t stream);
// x [T, n] cut into column blocks: part p, columns [end[p - 1], end[p]) (from
// 0; end[count - 1] == n), into dst[p] [T, its width]; 4-byte elements, one launch.
struct ColumnParts {
  static constexpr int kMax = 4;
  float* dst[kMax] = {};
  int64_t end[kMax] = {};
  int count = 0;
};
cudaError_t launch_split_columns(const float* x, int64_t T, int64_t n, const ColumnParts& parts, cudaStream_t stream);
// h += x (rows of d), then y = RMSNorm(h) * w; bit-identical to launch_add + launch_rms_norm.
cudaError_t launch_add_rms_norm(float* h, const float* x, const void* w, DType w_dtype, float* y, int64_t rows,
                                int64_t d, float eps, cudaStream_t stream);
cudaError_t launch_convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                           cudaStream_t stream);

cudaError_t launch_fill_random(void* dst, DType dtype, int64_t n, uint64_t seed, float scale, float offset,
                               cudaStream_t stream);

constexpr int kMaxRopeHalf = 256;  // head_dim up to 512
struct RopeParams {
  float inv_freq[kMaxRopeHalf];
  float attention_factor;
  int half;
  bool interleaved;
};
// x [T, heads, head_dim]; token t is at positions[t] when positions is set, else
// at *start_pos + t when start_pos is set (graph replay), else at pos0 + t.
cudaError_t launch_rope(float* x, const int32_t* positions, const int32_t* start_pos, int32_t pos0, int64_t T,
                        int64_t heads, int64_t head_dim, const RopeParams& params, cudaStream_t stream);

// Paged K/V (ops.h KvPages). Position p of sequence b sits in storage row
// table[b][p / kKvPageRows] * kKvPageRows + p % kKvPageRows, or row p when the
// sequence has no table (a contiguous cache). With rows_are_sequences, row r of
// q, k and v is the one new token of sequence r, every sequence at *pos;
// otherwise the rows are tokens t of sequence 0 at *pos + t. Passed by value
// (a graph bakes in the table addresses, never their contents).
constexpr int kKvPageRows = 16;         // = state/block_pool.h kKvBlockSize
constexpr int kMaxPagedSequences = 64;  // sequences per launch; larger batches launch in chunks
struct KvTables {
  const int32_t* table[kMaxPagedSequences] = {};
  bool rows_are_sequences = false;
};

// One warp per head row of one token: q rows get (optional) RMSNorm and RoPE in
// place, k rows the same and then go to k_cache at the token's position, v rows
// go to v_cache unchanged. q_norm / k_norm may be null (no q/k norm).
cudaError_t launch_qk_norm_rope_store(float* q, const float* k, const float* v, const void* q_norm,
                                      const void* k_norm, DType norm_dtype, float eps, const RopeParams& rope,
                                      const int32_t* start_pos, void* k_cache, void* v_cache, DType cache_dtype,
                                      int T, int n_heads, int n_kv_heads, int head_dim, const KvTables& tables,
                                      cudaStream_t stream);

// Split-K flash attention over n_splits shares of the visible keys (at least 64
// keys a share, so short contexts leave the last splits empty); the partial
// buffers hold T * n_heads * n_splits entries (times head_dim for part_o).
// The first token's position is *pos_dev when pos_dev is set (graph replay), else pos0.
// Then the partials are merged into out [T, n_heads, head_dim], unless out is
// null: the caller merges them (launch_attention_merge, or the o_proj matvec's
// input, lever fused_norm_matvec).
// The split count for n_keys keys (the visible ones, or for a graph the most a
// sequence can grow to) over kv_heads heads: about two blocks an SM at long
// contexts, at most 64. It does not depend on the rows, so that a sequence's
// attention is the same alone or in a batch.
int attention_splits(int64_t n_keys, int64_t kv_heads);
constexpr int kMaxAttentionSplits = 64;
constexpr int kMaxAttentionHeadDim = 256;
cudaError_t launch_attention(const float* q, const void* k, const void* v, DType kv_dtype, float* part_m,
                             float* part_l, float* part_o, float* out, int T, int n_heads, int n_kv_heads,
                             int head_dim, const int32_t* pos_dev, int64_t pos0, int n_splits, float scale,
                             const KvTables& tables, cudaStream_t stream, float* merged = nullptr);
// Whether launch_attention (and launch_rope_in_attention) of these rows, heads
// and splits merge the splits in clusters (lever cluster_attention_merge): then
// the caller passes `merged`, [T, n_heads, head_dim] f32, which they write
// instead of the partials (and out), and no merge kernel runs.
// `saves_merge_kernel`: the partials would otherwise be merged by the merge
// kernel (not inside the next matvec's prepare), so wider clusters pay.
bool attention_merges_in_clusters(int T, int n_heads, int n_kv_heads, int head_dim, DType kv_dtype, const void* k,
                                  const void* v, int n_splits, bool saves_merge_kernel);
// The splits launch_attention (and launch_rope_in_attention) of these rows
// write: the wide grid's, the partials past them marked empty; n_splits where
// the grid holds them all (the tensor-core kernel of lever
// tensor_core_attention runs on the same grid).
int attention_written_splits(int T, int n_heads, int n_kv_heads, int head_dim, DType kv_dtype, const void* k,
                             const void* v, int n_splits);
cudaError_t launch_attention_merge(const float* part_m, const float* part_l, const float* part_o, float* out, int T,
                                   int n_heads, int head_dim, int n_splits, cudaStream_t stream);

// launch_attention's partials for one new token per row (a decode step, or a
// batch's sequences) from the qkv matmul's rows as they are (lever
// rope_in_attention): the kernel applies the q/k norm and RoPE of
// launch_qk_norm_rope_store to q, and in the split holding the new key to k,
// writes k and v to the dense cache, and attends to that key from its own copy:
// the same bits as launch_qk_norm_rope_store then launch_attention, one kernel
// fewer. rope_in_attention_supports says where it applies (false: run those two).
struct FreshRows {
  const float *q = nullptr, *k = nullptr, *v = nullptr;  // [rows, heads, head_dim]
  const void *q_norm = nullptr, *k_norm = nullptr;       // per-head RMSNorm weights, or null
  DType norm_dtype = DType::f32;
  float eps = 0;
  void *k_cache = nullptr, *v_cache = nullptr;  // the dense cache launch_attention reads
};
// The rows (sequences) of a step it takes: one, or up to 4 where a kv head has
// at most 4 query heads, or up to 8 with groups of up to 8 where the 8-warp blocks
// of lever wide_attention_blocks run (their grid fits a wave: short contexts).
// Every split block ropes its q rows itself, so large batches over many splits
// pay more than the launch saved: Llama-3-8B int4 (groups of 4) at 8k keys, 4
// sequences -1% and 8 -3% (2 and 3 at d0 +4% and +6%); Qwen3-30B-A3B int4
// (groups of 8) in 4-warp blocks 1 sequence +0.8%, 2 -2.4%, 3 -5.8%, 4 -3.6%,
// in 8-warp blocks 2 +6%, 4 +2%; in 8-warp blocks at d0, 5 / 8 sequences
// Llama-3-8B int4 +4.6% / +3.3%, Qwen3-30B-A3B int4 +3.8% / +2.0% (H200, 2026-11-30).
bool rope_in_attention_takes_rows(int rows, int n_heads, int n_kv_heads, int n_splits);
bool rope_in_attention_supports(int head_dim, int n_heads, int n_kv_heads, DType kv_dtype, const void* k_cache,
                                const void* v_cache);
cudaError_t launch_rope_in_attention(const FreshRows& fresh, const RopeParams& rope, DType kv_dtype, float* part_m,
                                     float* part_l, float* part_o, int T, int n_heads, int n_kv_heads, int head_dim,
                                     const int32_t* pos_dev, int n_splits, float scale, const KvTables& tables,
                                     cudaStream_t stream, float* merged = nullptr);

// The same attention for prefill on the tensor cores (flash_attention.cu): q f32
// [T, n_heads, head_dim], a bf16 K/V cache, head_dim 64, 128 or 256, 16-byte
// aligned q, k and v; q and P are rounded to bf16, accumulation is f32. The
// cuda_ops dispatch takes it from kFlashAttentionMinTokens new tokens on.
constexpr int kFlashAttentionMinTokens = 16;
bool flash_attention_supports(int head_dim);
// A tile shape: `warps` warps of 16 * warp_m_tiles query rows, `keys` keys per
// K/V tile, Q's fragments kept in registers or read from shared memory per tile,
// registers capped so that min_blocks blocks fit on an SM.
struct FlashAttentionTile {
  int warps, warp_m_tiles, keys;
  bool q_in_registers;
  int min_blocks;
};
// The shapes compiled for head_dim (0 when unsupported); variant -1 is the default.
int flash_attention_variants(int head_dim);
FlashAttentionTile flash_attention_tile(int head_dim, int variant);
cudaError_t launch_flash_attention(const float* q, const void* k, const void* v, float* out, int T, int n_heads,
                                   int n_kv_heads, int head_dim, const int32_t* pos_dev, int64_t pos0, float scale,
                                   cudaStream_t stream, int variant = -1);

// src [T, row] converted to dst's dtype into the rows of positions *pos_dev + t
// (through the tables when paged).
cudaError_t launch_store_rows(const float* src, void* dst, DType dst_dtype, const int32_t* pos_dev, int64_t T,
                              int64_t row, const KvTables& tables, cudaStream_t stream);
// dst [n, row_bytes] = storage rows of positions [0, n) of one sequence (table
// of kKvPageRows-row blocks): a paged cache's visible rows made contiguous.
cudaError_t launch_gather_pages(const void* storage, void* dst, int64_t row_bytes, const int32_t* table, int64_t n,
                                cudaStream_t stream);

// Groupwise affine K/V caches (ops.h AffineRows): codes u8 [rows, heads,
// head_dim * bits / 8], bf16 scales and biases [rows, heads, head_dim / group],
// groups of kKvQuantGroup along head_dim (the whole head when it is shorter).
constexpr int kKvQuantGroup = 64;  // = ops::kKvQuantGroup
struct AffineKv {
  const void *k_codes, *v_codes, *k_scales, *k_biases, *v_scales, *v_biases;
  int bits;
};
struct AffineKvOut {
  void *k_codes, *v_codes, *k_scales, *k_biases, *v_scales, *v_biases;
  int bits;
};
// x [T, heads, head_dim] f32 quantized into the rows of positions *pos_dev + t
// (through the tables when paged), one warp a row.
cudaError_t launch_store_rows_affine(const float* x, void* codes, void* scales, void* biases, int bits,
                                     const int32_t* pos_dev, int T, int heads, int head_dim, const KvTables& tables,
                                     cudaStream_t stream);
// Rows [0, rows) dequantized to bf16 out [rows, heads, head_dim].
cudaError_t launch_dequantize_rows(const void* codes, const void* scales, const void* biases, int bits, void* out,
                                   int64_t rows, int heads, int head_dim, cudaStream_t stream);
// launch_attention over an affine cache: the GQA kernel reads the codes and
// dequantizes in registers. head_dim a multiple of 8, at most kMaxAttentionHeadDim.
bool attention_affine_supports(int head_dim);
cudaError_t launch_attention_affine(const float* q, const AffineKv& kv, float* part_m, float* part_l, float* part_o,
                                    float* out, int T, int n_heads, int n_kv_heads, int head_dim,
                                    const int32_t* pos_dev, int64_t pos0, int n_splits, float scale,
                                    const KvTables& tables, cudaStream_t stream);
// The split kernel of launch_attention_affine on the tensor cores (q and p s
// rounded to f16; the partials only, no merge): head_dim 64 or 128.
bool attention_affine_mma_supports(int head_dim, int bits);
cudaError_t launch_attention_affine_mma(const float* q, const AffineKv& kv, float* part_m, float* part_l,
                                        float* part_o, int T, int n_heads, int n_kv_heads, int head_dim,
                                        const int32_t* pos_dev, int64_t pos0, int n_splits, float scale,
                                        const KvTables& tables, cudaStream_t stream);
// launch_qk_norm_rope_store writing an affine cache: each k and v row quantized by its warp.
cudaError_t launch_qk_norm_rope_store_affine(float* q, const float* k, const float* v, const void* q_norm,
                                             const void* k_norm, DType norm_dtype, float eps, const RopeParams& rope,
                                             const int32_t* start_pos, const AffineKvOut& cache, int T, int n_heads,
                                             int n_kv_heads, int head_dim, const KvTables& tables,
                                             cudaStream_t stream);

}  // namespace mere::cuda
