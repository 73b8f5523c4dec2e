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
  const std::vector<float> bias_f32 = to_f32(bias);
  const TiledTokens tokens = tiled_matmul_applies() ? tiled_tokens(x.data<float>(), T, in) : TiledTokens{};
  const int64_t block_rows = tiled_block_rows(tokens, n_out), n_blocks = (n_out + block_rows - 1) / block_rows;
  parallel_for(n_blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    float* rows = thread_scratch(0, size_t(block_rows * in));
    for (int64_t b = block_begin; b < block_end; ++b) {
      int64_t r0 = b * block_rows, r1 = std::min(n_out, r0 + block_rows);
      load_f32(w, r0 * in, (r1 - r0) * in, rows);
      if (tiled_rows_product(tokens, rows, r1 - r0, bias_f32.empty() ? nullptr : bias_f32.data() + r0,
                             out.data<float>() + r0, n_out))
        continue;
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x.data<float>() + t * in;
        float* yt = out.data<float>() + t * n_out;
        for (int64_t r = r0; r < r1; ++r) {
          float y = dot(xt, rows + (r - r0) * in, in);
          yt[r] = bias_f32.empty() ? y : y + bias_f32[size_t(r)];
        }
      }
    }
  });
}

}  // namespace mere::ops::cpu
