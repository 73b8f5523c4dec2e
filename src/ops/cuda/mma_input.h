// The input of a tensor-core decode matvec (affine_matvec_mma.cu,
// fp8_matvec_mma.cu), which its prepare kernel converts into the image the
// matvec's blocks stage: x as it is, or formed on the way in (lever
// fused_norm_matvec): RMSNorm(h) norm_w, silu(gate) up from gate_up [T, 2 in]
// (as silu_mul_halves), or split-K attention's partials merged (as
// launch_attention_merge; in = heads * head_dim).
#pragma once

#include "core/dtype.h"

namespace mere::cuda {

struct MmaInput {
  enum class Kind { plain, rms_normed, silu_gated, attention_splits };
  Kind kind = Kind::plain;
  // [T, in]; rms_normed: h [T, in]; silu_gated: gate_up [T, 2 in];
  // attention_splits: the partial outputs [T, heads, splits, head_dim]
  const float* x = nullptr;
  const void* norm_w = nullptr;
  DType norm_dtype = DType::f32;
  float eps = 0;
  const float* split_max = nullptr;  // attention_splits: [T, heads, splits]
  const float* split_sum = nullptr;
  int splits = 0, head_dim = 0;
  int live_splits = 0;  // attention_splits: the first splits, the rest empty and not read; 0: all
  // The affine matvec's base-256 digits of x: 3 (23 bits) or 2 (15 bits, lever
  // int16_activation_matvec). The FP8 matvec always takes x as two f16.
  int digits = 3;
};

}  // namespace mere::cuda
