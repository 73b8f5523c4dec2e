// Launchers of the MLX affine-quantized kernels (affine_matvec.cu): raw
// pointers, sizes and a stream, no Tensor and no {fmt}. Each returns the
// launch's cudaError_t. The weight is w[o, i] = scales[o, g] * q[o, i] +
// biases[o, g], g = i / group_size, q unsigned of `bits` bits packed 32 / bits
// to a u32 word, the first in the lowest bits (ops/weight.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "ops/cuda/fp8_launchers.h"
#include "ops/cuda/mma_input.h"

namespace mere::cuda {

struct AffineArgs {
  const uint32_t* packed = nullptr;  // [out, in * bits / 32], 16-byte aligned
  const void* scales = nullptr;      // [out, in / group_size]
  const void* biases = nullptr;      // [out, in / group_size]
  DType scale_dtype = DType::bf16;   // of scales and biases: f32, f16 or bf16
  int bits = 4, group_size = 64;     // 4 or 8; 32, 64 or 128
  int64_t in = 0, out = 0;
};

// The decode matvec takes T <= kMaxMatvecTokens (launchers.h), bits 4 or 8,
// groups of 32, 64 or 128, in a multiple of 32 and 16-byte aligned packed and x.
bool affine_matvec_supports(const AffineArgs& w, int64_t T);

// How the matvec shares out the work: `rows` rows per warp, `batch` 16-byte
// loads per row and lane in flight, `split` warps per row group (split-K; a
// power of two up to 8), `stage` x read through L1 (0), copied to shared memory
// (1), or quantized to int8 in shared memory (2, lever int8_activation_matvec).
// Zeros (stage -1) pick the defaults for T, the matrix and the levers; the
// alternative rows and batches are compiled for T = 1 with bf16 scales only.
struct AffineMatvecPlan {
  int rows = 0, batch = 0, split = 0, stage = -1;
};
// The plan a launch with these arguments uses (zeros in `hint` filled in).
AffineMatvecPlan affine_matvec_plan(const AffineArgs& w, int64_t T, AffineMatvecPlan hint = {});

// y[T, out] = x[T, in] dequant(w)^T (+ bias[out]); f32 x, y and bias, f32
// arithmetic: per group scale * sum(q x) + bias * sum(x). Stage 2 rounds x to
// int8 per 32 values first (d = max|x| / 127) and sums q x in int32.
cudaError_t launch_affine_matvec(const AffineArgs& w, const float* x, const float* bias, float* y, int64_t T,
                                 cudaStream_t stream, AffineMatvecPlan hint = {});

// The same with x = RMSNorm(h) norm_w formed in each block (lever
// fused_norm_matvec, for matrices too small to pay on the tensor cores: a MoE
// router): h norm_w staged in shared memory, the sums scaled by 1 / rms(h).
// Needs what launch_affine_matvec needs, in <= 4096 and x's staged copy to fit;
// norm weights f32, f16 or bf16, 16-byte aligned. allow_after_wait (as the
// prepare kernels'): the next kernel starts only after this one's wait, so that
// it may read what the kernel before this one wrote before its own wait.
struct AffineMatvecNorm {
  const void* w = nullptr;
  DType dtype = DType::f32;
  float eps = 0;
  bool allow_after_wait = false;
};
bool affine_matvec_normed_supports(const AffineArgs& w, int64_t T, DType norm_dtype);
cudaError_t launch_affine_matvec_normed(const AffineArgs& w, const float* h, const AffineMatvecNorm& norm,
                                        const float* bias, float* y, int64_t T, cudaStream_t stream);

// The same product on the tensor cores (affine_matvec_mma.cu, lever
// tensor_core_affine_matvec): u8 codes times the s8 base-256 digits of x
// rounded per group to 23 bits (3 digits) or, under lever
// int16_activation_matvec, to 15 bits (2 digits), s32 sums. T <= 8 (16 in two
// digits: kMaxTensorCoreMatvecTokens), bits 4 or
// 8, groups of 32, 64 or 128, a row a whole number of stages (256 values; 128
// for int8 with groups of 32 or 64). x's converted copy (digits x T x in bytes)
// goes to each block's shared memory; where it does not fit, the row runs as up
// to 8 launches of whole stages, each adding into y. `scratch` (16-byte aligned,
// affine_matvec_mma_scratch_bytes) holds that copy, one image per launch's
// columns, all written by one first kernel; two calls on one stream may share it.
bool affine_matvec_mma_supports(const AffineArgs& w, int64_t T, int digits = 3);
int64_t affine_matvec_mma_scratch_bytes(const AffineArgs& w, int64_t T, int digits = 3);
// Warps a tile (split-K) of its launch, or of the first where the row is cut; 0
// where the kernel does not run.
int affine_matvec_mma_split(const AffineArgs& w, int64_t T, int digits = 3);
cudaError_t launch_affine_matvec_mma(const AffineArgs& w, const float* x, const float* bias, float* y, int64_t T,
                                     void* scratch, cudaStream_t stream, int digits = 3);

// The tensor-core matvec kernel (dense, or an MoE experts' mode) that takes the
// most local memory a thread (register spills, a stack frame), over every
// kernel the launches can pick; bytes 0 when none takes any. A spill in the loop costs: at
// 80 registers the int8 MoE gate/up kernel spilled, and Qwen3-30B-A3B int8
// decode ran 2.3% slower (docs/benchmarks.md, twenty-fourth session).
struct MmaKernelLocal {
  int64_t bytes = 0;
  int bits = 0, group = 0, mmas = 0, digits = 0;
  DType scale_dtype = DType::f32;
  const char* mode = "";  // "dense", "gate/up" or "down"
};
MmaKernelLocal affine_matvec_mma_most_local();

// The same with the input formed on the way in (mma_input.h; head_dim of
// attention's splits a multiple of 8); accumulate adds the product into y (the residual).
using AffineMmaInput = MmaInput;
cudaError_t launch_affine_matvec_mma(const AffineArgs& w, const AffineMmaInput& input, const float* bias, float* y,
                                     int64_t T, void* scratch, cudaStream_t stream, bool accumulate);

// Prefill: y[T, out] = x[T, in] dequant(w)^T (+ bias[out]) on the tensor cores
// (affine_gemm.cu, lever tensor_core_affine_gemm): the weight dequantized to
// bf16 in registers as launch_affine_dequantize does, x rounded to bf16 into
// `scratch` (16-byte aligned, affine_gemm_scratch_bytes for the same plan), f32
// sums, y and bias. Needs in a multiple of 64 and of the group size, 16-byte
// aligned codes, and scales and biases aligned to their size. The plan (zeros
// pick) is for tests: tokens a block (32, 64, 128 or 256), and splits of the
// k-tiles (1-8, at most one a tile). Two splits add into y (zeroed) by atomics,
// which two terms keep deterministic; more leave their sums in the scratch and
// the last split of a tile adds them in split order.
struct AffineGemmPlan {
  int tokens = 0, splits = 0;
};
bool affine_gemm_supports(const AffineArgs& w, int64_t T);
int64_t affine_gemm_scratch_bytes(const AffineArgs& w, int64_t T, AffineGemmPlan plan = {});
cudaError_t launch_affine_gemm(const AffineArgs& w, const float* x, void* scratch, const float* bias, float* y,
                               int64_t T, cudaStream_t stream, AffineGemmPlan plan = {});

// FP8 E4M3 weights with f32 scales of 128 x 128 blocks on the same GEMM (lever
// tensor_core_fp8_gemm): each value times its block's scale, rounded once to
// bf16 in registers, the weights launch_fp8_dequantize's bf16 copy holds for
// the dense GEMM; x rounded to bf16, f32 sums. Needs blocks of 128, in a
// multiple of 64, 16-byte aligned values. Scratch and plan as above.
bool fp8_dequantizing_gemm_supports(const Fp8WeightView& w, int64_t T);
int64_t fp8_dequantizing_gemm_scratch_bytes(const Fp8WeightView& w, int64_t T, AffineGemmPlan plan = {});
cudaError_t launch_fp8_dequantizing_gemm(const Fp8WeightView& w, const float* x, void* scratch, const float* bias,
                                         float* y, int64_t T, cudaStream_t stream, AffineGemmPlan plan = {});

// The same GEMM grouped by expert (the MoE experts' prefill, levers
// tensor_core_affine_moe_gemm and tensor_core_dense_moe_gemm): `w` is expert
// 0's matrix (out rows of in columns), expert e's starting expert_stride rows
// further. Its weights are MLX affine (as above), bf16 values (`packed` the
// values; `bits`, `scales` and the rest unused) or FP8 E4M3 values with f32
// scales of 128 x 128 blocks (`packed` the values, `scales` [out / 128, in /
// 128 rounded up] from expert 0's first row; expert_stride a multiple of 128).
// x holds the P (token, slot) pairs sorted by expert as bf16 rows
// (launch_affine_grouped_input or launch_affine_grouped_swiglu, for w's bits);
// expert e's pairs are rows [offsets[e], offsets[e + 1]) and its tiles of
// `tokens` rows (32, 64 or 128) start at tile_offsets[e], both on the device.
// y [P, out] f32, sorted rows.
enum class GroupedWeights { affine, bf16, fp8 };
struct AffineGroupedGemm {
  AffineArgs w;
  GroupedWeights kind = GroupedWeights::affine;
  int64_t expert_stride = 0;
  int E = 0;
  const void* x_bf16 = nullptr;  // [P, in], 16-byte aligned
  int64_t P = 0;
  const int32_t* offsets = nullptr;       // [E + 1]
  const int32_t* tile_offsets = nullptr;  // [E + 1]
  int tokens = 32;
  float* y = nullptr;
};
// Whether the kernel takes g's shapes and alignments (its pointers but x_bf16 and y).
bool affine_grouped_gemm_supports(const AffineGroupedGemm& g);
cudaError_t launch_affine_grouped_gemm(const AffineGroupedGemm& g, cudaStream_t stream);
// Gate and up in one launch with SwiGLU in its epilogue: act_bf16 [P, out] =
// silu(x gate^T) * (x up^T), rounded to bf16 in the order the down GEMM of
// down_bits reads it (launch_affine_grouped_swiglu's values, without the f32
// products). gate and up alike but for their weights and y (unused); out a
// multiple of 64.
bool affine_grouped_swiglu_gemm_supports(const AffineGroupedGemm& gate, const AffineGroupedGemm& up);
cudaError_t launch_affine_grouped_swiglu_gemm(const AffineGroupedGemm& gate, const AffineGroupedGemm& up,
                                              int down_bits, void* act_bf16, cudaStream_t stream);
// x_bf16 [P, in]: row r is token sorted_pair[r] / k's row of x [T, in], in the
// order the GEMM of a `bits`-bit weight reads it (4-bit codes: permuted within
// each 64 values; 8 or 16 bits: as is).
cudaError_t launch_affine_grouped_input(const float* x, const int32_t* sorted_pair, int64_t k, int64_t P, int64_t in,
                                        int bits, void* x_bf16, cudaStream_t stream);
// act_bf16 [P, f] = silu(gate) * up (f32 [P, f] each), in that order.
cudaError_t launch_affine_grouped_swiglu(const float* gate, const float* up, int64_t P, int64_t f, int bits,
                                         void* act_bf16, cudaStream_t stream);

// dst [out, in] = dequant(w) in dst_dtype (f32, f16 or bf16), each value
// computed in f32 as scale * q + bias and rounded once (Weight::dequantize).
cudaError_t launch_affine_dequantize(const AffineArgs& w, void* dst, DType dst_dtype, cudaStream_t stream);

// out [T, in] f32 = rows ids[t] of dequant(w); ids on the device (graph replay
// reads them there). Ids outside [0, out) give rows of NaN.
cudaError_t launch_affine_embed(const AffineArgs& w, const int32_t* ids, int64_t T, float* out, cudaStream_t stream);

// Random bytes (a counter hash of seed and position), each ANDed with
// byte_mask: packed integer weights (0xff) or FP8 E4M3 values without the NaN
// pattern (0xbf clears the top exponent bit: |v| < 2). dst 8-byte aligned.
cudaError_t launch_fill_random_bytes(void* dst, int64_t n_bytes, uint64_t seed, uint8_t byte_mask,
                                     cudaStream_t stream);

}  // namespace mere::cuda
