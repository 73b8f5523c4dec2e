#include "quant/fp8_quantize.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"

namespace mere {

Fp8Weight quantize_fp8(const Tensor& dense, int block) {
  MERE_CHECK(dense.device() == Device::cpu && dense.rank() == 2, "quantize_fp8: expected a CPU matrix, got {} on {}",
             shape_str(dense.shape()), dense.device() == Device::cpu ? "the CPU" : "the GPU");
  MERE_CHECK(block > 0, "quantize_fp8: block {} must be positive", block);
  const Tensor w = dense.dtype() == DType::f32 ? dense : dense.to(DType::f32);
  const int64_t out = w.dim(0), in = w.dim(1), block_rows = (out + block - 1) / block,
                block_cols = (in + block - 1) / block;
  const float* src = w.data<float>();
  for (int64_t i = 0; i < out * in; ++i)
    MERE_CHECK(std::isfinite(src[i]), "quantize_fp8: weight [{}, {}] is {}; FP8 blocks need finite weights", i / in,
               i % in, src[i]);
  Fp8Weight q{Tensor::empty({out, in}, DType::f8_e4m3), Tensor::empty({block_rows, block_cols}, DType::f32), block};
  uint8_t* values = q.values.data<uint8_t>();
  float* scales = q.scale_inv.data<float>();
  parallel_for(block_rows, 1, [&](int64_t first, int64_t last) {
    for (int64_t br = first; br < last; ++br) {
      const int64_t r0 = br * block, r1 = std::min(out, r0 + block);
      for (int64_t bc = 0; bc < block_cols; ++bc) {
        const int64_t c0 = bc * block, c1 = std::min(in, c0 + block);
        float amax = 0;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(src[r * in + c]));
        const float scale = amax > 0 ? amax / 448.0f : 1.0f;
        scales[br * block_cols + bc] = scale;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) values[r * in + c] = f32_to_f8_e4m3(src[r * in + c] / scale);
      }
    }
  });
  return q;
}

}  // namespace mere
