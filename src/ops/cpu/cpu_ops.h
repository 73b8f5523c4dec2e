// The CPU reference implementations behind ops.h. Arguments are already checked.
#pragma once

#include "ops/ops.h"

namespace mere::ops::cpu {

void embed(const Tensor& table, const std::vector<int32_t>& ids, Tensor& out);
void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out);
void linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out);
void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out);
void add_inplace(Tensor& h, const Tensor& x);
void silu_mul_halves(const Tensor& gate_up, Tensor& out);
// x [T, n] into parts [T, w_i]: its column blocks in order (the widths sum to n).
void split_columns(const Tensor& x, std::vector<Tensor>& parts);

void rope(Tensor& x, const std::vector<int32_t>& positions, const RopeTable& table);
void convert(const Tensor& src, Tensor& dst);
void fill_random(Tensor& t, uint64_t seed, float scale, float offset);
void attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0, float scale,
               Tensor& out);
// The same over a quantized cache: a decode step's tiles read the codes (lever
// cpu_vector_attention), otherwise the visible rows are dequantized first.
void attention(const Tensor& q, const AffineRows& k, const AffineRows& v, int64_t pos0, float scale, Tensor& out);

// Groupwise affine K/V rows (ops.h AffineRows): x [T, heads, head_dim] into q's
// rows [0, T) (allocated); q's rows [0, n) into out f32; x into dst's rows [pos, pos + T).
void quantize_kv_rows(const Tensor& x, AffineRows& q);
void dequantize_kv_rows(const AffineRows& q, int64_t n, Tensor& out);
void store_rows(const Tensor& x, AffineRows& dst, int64_t pos);

// Converts n elements of a float tensor's storage (f32/f16/bf16) starting at
// element `offset` into dst as f32.
void load_f32(const Tensor& src, int64_t offset, int64_t n, float* dst);
float dot(const float* a, const float* b, int64_t n);
// A whole float tensor (a bias) as f32; empty for an undefined one.
std::vector<float> to_f32(const Tensor& t);
// x [T, in] f32 summed over each group of `group` columns: [T, in / group]
// (the bias term of the affine dequantize-dot, bias * sum(x)).
std::vector<float> group_sums(const Tensor& x, int64_t group);

// Lever cpu_direct_matvec: linear, affine_linear and fp8_linear of 1-8 tokens
// convert the stored weights in registers instead of staging rows as f32
// (decode_matvec.cpp). The direct forms return false where they do not apply
// (more tokens, no AVX2, groups not of whole 8-byte runs of codes, FP8 rows not
// of whole 16-value steps, the lever off); direct_matvec_runs counts the calls
// they served.
void set_direct_matvec(bool on);
int64_t direct_matvec_runs();
bool direct_matvec(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out);
bool direct_affine_matvec(const Tensor& x, const AffineWeight& w, const Tensor& bias, Tensor& out);
bool direct_fp8_matvec(const Tensor& x, const Fp8Weight& w, const Tensor& bias, Tensor& out);

// Lever cpu_vnni_matvec: affine_linear of 1-8 tokens as integer dot products
// (AVX-512 VNNI) of the codes and x rounded per group to 23 bits, three s8 digits
// (vnni_matvec.cpp); ahead of direct_affine_matvec where both apply. False where
// it does not apply (the lever off, no AVX-512 VNNI, more tokens, groups above
// 1,024 or not of whole 32-byte steps but int4 g32, x not finite); vnni_matvec_runs
// counts the calls it served.
void set_vnni_matvec(bool on);
int64_t vnni_matvec_runs();
bool vnni_available();
bool vnni_affine_matvec(const Tensor& x, const AffineWeight& w, const Tensor& bias, Tensor& out);

// Lever cpu_vector_attention: attention (attention.cpp) by one task per tile (a kv
// head's query heads at a few tokens, or a run of a decode step's keys) in AVX2
// registers instead of one scalar task per query head and token; false
// (the scalar form) without AVX2 or head_dim not a multiple of 8.
// vector_attention_runs counts the calls it served.
void set_vector_attention(bool on);
int64_t vector_attention_runs();
// Decode steps whose keys it split into runs across threads (fewer kv heads than threads).
int64_t attention_decode_run_splits();
// Calls that read a quantized cache's codes in place (a decode step's tiles).
int64_t attention_code_reads();

// Lever cpu_avx512_attention: cpu_vector_attention's prefill tiles (8 query rows
// or more) as outer products in 512-bit registers (avx512_attention.cpp), where
// the CPU has AVX-512F. avx512_attention_tiles counts the tiles it served.
void set_avx512_attention(bool on);
int64_t avx512_attention_tiles();

// Lever cpu_avx512_matmul: tiled_rows_product in 512-bit registers, tiles of
// 4 rows by 6 tokens (avx512_matmul.cpp), where the CPU has AVX-512F; false
// where it does not apply (the lever off, no AVX-512F). avx512_matmul_blocks
// counts the blocks it multiplied.
void set_avx512_matmul(bool on);
int64_t avx512_matmul_blocks();
bool avx512_matmul_available();
bool avx512_rows_product(const float* x, int64_t T, int64_t in, const float* rows, int64_t n_rows, const float* bias,
                         float* out, int64_t n_out);

// Lever cpu_tiled_matmul: the staged forms multiply each block of rows, once in
// f32, by the tokens in register tiles (the direct form's f32 kernel, 4 tokens a
// pass) instead of one dot product per row and token. The tokens are x [T, in],
// made once per matmul by tiled_tokens (which packs them where lever
// cpu_packed_matmul applies). tiled_rows_product: out[t, r] = rows[r] . x[t]
// (+ bias[r]) for n_rows rows of `in` f32 values, out's rows n_out apart; false
// where it does not apply (the lever off, no AVX2). tiled_matmul_blocks counts
// the blocks it multiplied.
struct TiledTokens {
  const float* x = nullptr;
  int64_t T = 0, in = 0;
  Tensor packed;  // cpu_packed_matmul's [ceil(T / 16), in, 16] f32, tokens past T 0; else undefined
};
TiledTokens tiled_tokens(const float* x, int64_t T, int64_t in);
void set_tiled_matmul(bool on);
int64_t tiled_matmul_blocks();
bool tiled_matmul_applies();
bool tiled_rows_product(const TiledTokens& x, const float* rows, int64_t n_rows, const float* bias, float* out,
                        int64_t n_out);
// Rows a staged block holds for these tokens: 16, or up to 64 for the packed
// product (a block reads every packed token once) while each thread gets two blocks.
int64_t tiled_block_rows(const TiledTokens& x, int64_t n_out);

// Lever cpu_packed_matmul: tiled_rows_product as an outer product of the packed
// tokens (16 to a 512-bit vector) and broadcast weights, tiles of 8 rows by 48
// tokens (packed_matmul.cpp); tiled_tokens packs only where the CPU has AVX-512F
// and T >= 64. False where the tokens are not packed. packed_matmul_blocks counts
// the blocks it multiplied.
void set_packed_matmul(bool on);
int64_t packed_matmul_blocks();
bool packed_rows_product(const TiledTokens& x, const float* rows, int64_t n_rows, const float* bias, float* out,
                         int64_t n_out);

// A thread's scratch floats (at least n) in one of kScratchSlots slots, kept
// across calls: the staged forms' blocks of rows, which a matmul would otherwise
// allocate (and zero) in each of its tasks. Valid until the thread asks for the
// same slot again.
constexpr int kScratchSlots = 3;
float* thread_scratch(int slot, size_t n);

// Mixture of experts (ops.h), arguments checked and outputs allocated.
void moe_route(const Tensor& logits, const MoeRouting& routing, const Tensor& correction, MoeChoice& choice);
void moe_experts(const Tensor& x, const ExpertWeights& experts, const MoeChoice& choice, Tensor& out);
void add_gated(Tensor& out, const Tensor& y, const Tensor& gate);

}  // namespace mere::ops::cpu
