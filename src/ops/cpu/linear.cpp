#include <algorithm>
#include <vector>

#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {

// Threads split the output features; each converts a block of weight rows to
// f32 once and reuses it for every token, so prefill reads each weight once.
void linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  if (direct_matvec(x, w, bias, out)) return;
  const int64_t T = x.dim(0), in = x.dim(1), n_out = w.dim(0);
  constexpr int64_t kRowsPerBlock = 16;
  const std::vector<float> bias_f32 = to_f32(bias);
  const int64_t n_blocks = (n_out + kRowsPerBlock - 1) / kRowsPerBlock;
  parallel_for(n_blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    std::vector<float> rows(size_t(kRowsPerBlock * in));
    for (int64_t b = block_begin; b < block_end; ++b) {
      int64_t r0 = b * kRowsPerBlock, r1 = std::min(n_out, r0 + kRowsPerBlock);
      load_f32(w, r0 * in, (r1 - r0) * in, rows.data());
      if (tiled_rows_product(x.data<float>(), T, in, rows.data(), r1 - r0,
                             bias_f32.empty() ? nullptr : bias_f32.data() + r0, out.data<float>() + r0, n_out))
        continue;
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x.data<float>() + t * in;
        float* yt = out.data<float>() + t * n_out;
        for (int64_t r = r0; r < r1; ++r) {
          float y = dot(xt, rows.data() + (r - r0) * in, in);
          yt[r] = bias_f32.empty() ? y : y + bias_f32[size_t(r)];
        }
      }
    }
  });
}

}  // namespace mere::ops::cpu
