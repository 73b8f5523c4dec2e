// Kernel launchers for FP8 E4M3 weights with block scales (fp8_matvec.cu): raw
// pointers, sizes and a stream, no Tensor and no {fmt}. A weight is `values`
// (E4M3 bytes, [out, in] row-major) and `scale_inv` (f32 [ceil(out / block),
// ceil(in / block)] row-major); its element [o, i] is value[o, i] *
// scale_inv[o / block, i / block].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "ops/cuda/mma_input.h"

namespace mere::cuda {

struct Fp8WeightView {
  const uint8_t* values = nullptr;
  const float* scale_inv = nullptr;
  int64_t out = 0, in = 0;
  int64_t scale_cols = 0;  // ceil(in / block)
  int block = 128;
};

// y[T, out] = x[T, in] w^T (+ bias[out]) for T <= kMaxFp8MatvecTokens, f32
// accumulation. Block 128, in % 4 == 0, a 16-byte aligned x and 4-byte aligned
// values take the fast kernel; anything else a plain one. `variant` >= 0 picks a
// compiled tile shape for T = 1 and 8 (to compare them); -1 is the default.
constexpr int kMaxFp8MatvecTokens = 8;
cudaError_t launch_fp8_matvec(const float* x, const Fp8WeightView& w, const float* bias, float* y, int64_t T,
                              cudaStream_t stream, int variant = -1);
struct Fp8MatvecTile {
  int rows_per_warp, steps_in_flight;  // a step: 128 columns of a row, 4 bytes a lane
  bool pipelined;                      // the next steps load while these are summed
  int split;                           // warps sharing the rows' columns
};
int fp8_matvec_variants();
Fp8MatvecTile fp8_matvec_tile(int variant);
// The split the default tile (2 rows x 8 steps) takes for w under lever
// matvec_split_k (1 with it off); the variant of that split gives the same bits.
int fp8_matvec_split(const Fp8WeightView& w);

// The same product on the tensor cores (fp8_matvec_mma.cu, lever
// tensor_core_fp8_matvec): E4M3 weights as f16 mma operands, x per token and
// 128 columns as two f16 (hi and lo, 22 bits), f32 sums. T <= 8, block 128, in
// a multiple of 128, 16-byte aligned values, x and scratch. x's converted copy
// (4 T in bytes) goes to each block's shared memory; where it does not fit, the
// row runs as up to 8 launches of whole blocks, each adding into y. `scratch`
// (fp8_matvec_mma_scratch_bytes) holds that copy, written by one first kernel.
bool fp8_matvec_mma_supports(const Fp8WeightView& w, int64_t T);
int64_t fp8_matvec_mma_scratch_bytes(const Fp8WeightView& w, int64_t T);
cudaError_t launch_fp8_matvec_mma(const float* x, const Fp8WeightView& w, const float* bias, float* y, int64_t T,
                                  void* scratch, cudaStream_t stream);
// The same with the input formed on the way in by the first kernel (mma_input.h:
// RMSNorm(h) w, silu(gate) up, attention's splits merged, head_dim a multiple of
// 4); accumulate adds the product into y (the residual).
cudaError_t launch_fp8_matvec_mma(const MmaInput& input, const Fp8WeightView& w, const float* bias, float* y,
                                  int64_t T, void* scratch, cudaStream_t stream, bool accumulate);

// Activations for the FP8 GEMM: x [T, in] f32 -> q [T, in] E4M3 with one scale
// per token and 128 columns, scales[kb * scale_ld + t] = amax / 448 (cuBLASLt's
// VEC128_32F layout, tokens contiguous, scale_ld >= T), so that x ~ q * scale.
cudaError_t launch_fp8_quantize_activations(const float* x, int64_t T, int64_t in, uint8_t* q, float* scales,
                                            int64_t scale_ld, cudaStream_t stream);

// dst [out, in] = the dequantized weight, dst_dtype f32 or bf16.
cudaError_t launch_fp8_dequantize(const Fp8WeightView& w, void* dst, DType dst_dtype, cudaStream_t stream);

// Which path ops::linear takes for x [T, in] times an fp8 weight [out, in]
// (fp8_ops.cpp): "fp8 matvec", "fp8 tensor cores" (cuBLASLt block-scaled FP8),
// "fp8 tensor cores, bf16 out", or "bf16 dequantized" where cuBLASLt has no FP8 algorithm.
const char* fp8_gemm_path(int64_t T, int64_t in, int64_t out, int block);

// out [T, in] = rows ids[t] of w, dequantized; ids read on the device (graph replay).
cudaError_t launch_fp8_embed(const Fp8WeightView& w, const int32_t* ids, int64_t T, float* out, cudaStream_t stream);

}  // namespace mere::cuda
