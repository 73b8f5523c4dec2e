// FP8 (E4M3, block-scaled) matmul on the CPU: a fused dequantize-dot. Threads
// split the output rows; each row is decoded once through a 256-entry table
// (unscaled), then each token takes its dot product one block of columns at a
// time, and the block's scale multiplies that block's partial sum. The weight is
// never expanded beyond one row per thread.
#include <algorithm>
#include <array>
#include <vector>

#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/quantized_ops.h"

namespace mere::ops::cpu {
namespace {

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int bits = 0; bits < 256; ++bits) t[size_t(bits)] = f8_e4m3_to_f32(uint8_t(bits));
    return t;
  }();
  return table;
}

}  // namespace

void fp8_linear(const Tensor& x, const Fp8Weight& w, const Tensor& bias, Tensor& out) {
  const int64_t T = x.dim(0), in = x.dim(1), n_out = w.values.dim(0), block = w.block;
  const int64_t scale_cols = w.scale_inv.dim(1);
  const std::vector<float> bias_f32 = to_f32(bias);
  const std::array<float, 256>& table = e4m3_table();
  const uint8_t* values = w.values.data<uint8_t>();
  const float* scale_inv = w.scale_inv.data<float>();
  constexpr int64_t kRowsPerTask = 16;
  parallel_for((n_out + kRowsPerTask - 1) / kRowsPerTask, 1, [&](int64_t task_begin, int64_t task_end) {
    std::vector<float> row(static_cast<size_t>(in));
    for (int64_t r = task_begin * kRowsPerTask; r < std::min(n_out, task_end * kRowsPerTask); ++r) {
      const uint8_t* wr = values + r * in;
      for (int64_t i = 0; i < in; ++i) row[size_t(i)] = table[wr[i]];
      const float* scales = scale_inv + (r / block) * scale_cols;
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x.data<float>() + t * in;
        float y = 0;
        for (int64_t c = 0; c < in; c += block)
          y += scales[c / block] * dot(row.data() + c, xt + c, std::min(block, in - c));
        out.data<float>()[t * n_out + r] = bias_f32.empty() ? y : y + bias_f32[size_t(r)];
      }
    }
  });
}

}  // namespace mere::ops::cpu
