// FP8 E4M3 quantization of a dense weight with square block scales, the layout of
// DeepSeek-V3 and Qwen3-FP8 releases: per block of block x block weights, scale =
// amax / 448 (1 for an all-zero block), values = E4M3(w / scale), ties to even,
// and the checkpoint stores scale as `weight_scale_inv` (w ~ value * scale_inv).
#pragma once

#include "ops/weight.h"

namespace mere {

// `dense` is [out, in], f32/f16/bf16, on the CPU; blocks past the edges are partial.
Fp8Weight quantize_fp8(const Tensor& dense, int block = 128);

}  // namespace mere
