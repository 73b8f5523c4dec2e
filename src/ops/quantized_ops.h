// The backends of the quantized weight kinds (ops/weight.h), behind ops::linear
// and ops::embed: one function per kind and device. ops/quantized_ops.cpp
// dispatches; each kind's CPU and CUDA implementations live in their own files.
#pragma once

#include "ops/weight.h"

namespace mere::ops {

struct AttentionSplits;  // ops.h

// out [T, w.rows()] = x [T, w.cols()] @ w^T (+ bias), w quantized; on x's device.
void quantized_linear(const Tensor& x, const Weight& w, const Tensor& bias, Tensor& out);
// out [T, w.cols()] = rows ids of w, dequantized.
void quantized_embed(const Weight& w, const Tensor& ids, Tensor& out);

namespace cpu {
void affine_linear(const Tensor& x, const AffineWeight& w, const Tensor& bias, Tensor& out);  // ops/cpu/affine.cpp
void fp8_linear(const Tensor& x, const Fp8Weight& w, const Tensor& bias, Tensor& out);        // ops/cpu/fp8.cpp
}  // namespace cpu

namespace cuda {
void affine_linear(const Tensor& x, const AffineWeight& w, const Tensor& bias, Tensor& out);  // ops/cuda/affine_ops.cpp
void fp8_linear(const Tensor& x, const Fp8Weight& w, const Tensor& bias, Tensor& out);        // ops/cuda/fp8_ops.cpp
void affine_embed(const AffineWeight& w, const Tensor& ids, Tensor& out);                      // ops/cuda/affine_ops.cpp
// The fused decode forms (lever fused_norm_matvec) on the tensor-core affine
// matvec: the input is formed as x is converted, the product added into h
// (rms_norm_linear: else the CUDA-core form below); where linear takes the
// weight's bf16 copy and cuBLAS, the same forms there (lever
// formed_gemm_input). false where no such kernel applies (the caller composes
// the steps).
bool affine_rms_norm_linear(const Tensor& h, const Tensor& norm_w, float eps, const AffineWeight& w, const Tensor& bias,
                            Tensor& out);
// The same on the CUDA-core matvec, each block normalizing h itself (where
// the tensor cores do not pay: a MoE router); allow_after_wait: the next kernel
// starts only after this one's wait (affine_launchers.h).
bool affine_cuda_core_rms_norm_linear(const Tensor& h, const Tensor& norm_w, float eps, const AffineWeight& w,
                                      const Tensor& bias, Tensor& out, bool allow_after_wait);
bool affine_linear_add(Tensor& h, const Tensor& x, const AffineWeight& w, const Tensor& bias);
bool affine_swiglu_linear_add(Tensor& h, const Tensor& gate_up, const AffineWeight& w, const Tensor& bias);
// out = linear of swiglu(gate_up) on the bf16 copy (lever formed_gemm_input).
bool affine_swiglu_linear(const Tensor& gate_up, const AffineWeight& w, const Tensor& bias, Tensor& out);
bool affine_attention_linear_add(Tensor& h, const AttentionSplits& splits, const AffineWeight& w, const Tensor& bias);
// Whether T tokens of w take the tensor cores under lever tensor_core_affine_matvec;
// formed_input: in a fused form (RMSNorm, attention's splits or SwiGLU formed by
// the prepare kernel).
bool affine_matvec_on_tensor_cores(const AffineWeight& w, int64_t in, int64_t T, bool formed_input);
// Whether linear takes T tokens of this matrix on the tensor cores, as the levers stand.
bool affine_linear_on_tensor_cores(const AffineWeight& w, int64_t in, int64_t T);
// Whether the fused forms take T tokens on the bf16 copy (ops.h gemm_forms_input).
bool affine_gemm_forms_input(const AffineWeight& w, int64_t in, int64_t T);
void fp8_embed(const Fp8Weight& w, const Tensor& ids, Tensor& out);                            // ops/cuda/fp8_ops.cpp
// The same fused forms on the tensor-core FP8 matvec (ops/cuda/fp8_ops.cpp,
// lever tensor_core_fp8_matvec) and where linear takes the bf16 copy (lever
// formed_gemm_input); false where neither applies.
bool fp8_rms_norm_linear(const Tensor& h, const Tensor& norm_w, float eps, const Fp8Weight& w, const Tensor& bias,
                         Tensor& out);
bool fp8_linear_add(Tensor& h, const Tensor& x, const Fp8Weight& w, const Tensor& bias);
bool fp8_swiglu_linear_add(Tensor& h, const Tensor& gate_up, const Fp8Weight& w, const Tensor& bias);
bool fp8_swiglu_linear(const Tensor& gate_up, const Fp8Weight& w, const Tensor& bias, Tensor& out);
bool fp8_attention_linear_add(Tensor& h, const AttentionSplits& splits, const Fp8Weight& w, const Tensor& bias);
// Whether T tokens of w take the tensor cores where the lever is on.
bool fp8_matvec_on_tensor_cores(const Fp8Weight& w, int64_t T);
bool fp8_gemm_forms_input(const Fp8Weight& w, int64_t T);
}  // namespace cuda

}  // namespace mere::ops
