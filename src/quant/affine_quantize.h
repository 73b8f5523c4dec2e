// MLX's affine quantization of a dense weight: what `mx.quantize(w, group_size,
// bits)` (mode "affine") returns, so a checkpoint we write is the one mlx-lm
// would have written from the same weights.
#pragma once

#include "ops/weight.h"

namespace mere {

// `dense` is [out, in], f32/f16/bf16, on the CPU; groups of `group_size` run along
// the input dimension (which must divide by it). bits 4 or 8, group size 32, 64 or
// 128. Scales and biases are stored as `scale_dtype` (f32, f16 or bf16; MLX keeps
// the weight's dtype). Errors name the offending argument.
AffineWeight quantize_affine(const Tensor& dense, int bits, int group_size, DType scale_dtype);

}  // namespace mere
