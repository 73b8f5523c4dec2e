// FP8 (E4M3, block-scaled) matmul on the CPU: a fused dequantize-dot. Decode
// (1-8 tokens) takes lever cpu_direct_matvec's kernel where it applies
// (decode_matvec.cpp). Otherwise threads split the output rows in blocks (16, up to 64 for cpu_packed_matmul);
// each block of rows is decoded once into f32, 16 values a step through F16C
// (below), then multiplied by the tokens. With lever cpu_tiled_matmul the
// block's rows carry their block scales and go through the register-tiled
// product; without it each token takes its dot product one block of columns at
// a time, and the block's scale multiplies that block's partial sum. The weight
// is never expanded beyond one block of rows per thread.
#include <algorithm>
#include <array>
#include <vector>

#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/avx2.h"
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

// dst[i] = e4m3(src[i]) * multiplier: 16 values a step through F16C
// (avx2.h), a table for the tail.
void decode_e4m3(const uint8_t* src, int64_t n, float multiplier, float* dst) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
  const __m256 scale = _mm256_set1_ps(multiplier * 256.0f);
  for (; i + 16 <= n; i += 16) {
    __m256 low, high;
    e4m3x16_times_2_pow_minus_8(src + i, low, high);
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(low, scale));
    _mm256_storeu_ps(dst + i + 8, _mm256_mul_ps(high, scale));
  }
#endif
  const std::array<float, 256>& table = e4m3_table();
  for (; i < n; ++i) dst[i] = table[src[i]] * multiplier;
}

}  // namespace

void fp8_linear(const Tensor& x, const Fp8Weight& w, const Tensor& bias, Tensor& out) {
  if (direct_fp8_matvec(x, w, bias, out)) return;
  const int64_t T = x.dim(0), in = x.dim(1), n_out = w.values.dim(0), block = w.block;
  const int64_t scale_cols = w.scale_inv.dim(1);
  const std::vector<float> bias_f32 = to_f32(bias);
  const uint8_t* values = w.values.data<uint8_t>();
  const float* scale_inv = w.scale_inv.data<float>();
  const bool tiled = tiled_matmul_applies();
  const TiledTokens tokens = tiled ? tiled_tokens(x.data<float>(), T, in) : TiledTokens{};
  const int64_t block_rows = tiled_block_rows(tokens, n_out);
  parallel_for((n_out + block_rows - 1) / block_rows, 1, [&](int64_t task_begin, int64_t task_end) {
    float* rows = thread_scratch(0, size_t(block_rows * in));
    for (int64_t r0 = task_begin * block_rows; r0 < std::min(n_out, task_end * block_rows); r0 += block_rows) {
      const int64_t n_rows = std::min(block_rows, n_out - r0);
      for (int64_t r = 0; r < n_rows; ++r) {
        const float* scales = scale_inv + ((r0 + r) / block) * scale_cols;
        for (int64_t c = 0; c < in; c += block)  // the block scale folded in, or applied per partial sum
          decode_e4m3(values + (r0 + r) * in + c, std::min(block, in - c), tiled ? scales[c / block] : 1.0f,
                      rows + r * in + c);
      }
      if (tiled) {
        tiled_rows_product(tokens, rows, n_rows, bias_f32.empty() ? nullptr : bias_f32.data() + r0,
                           out.data<float>() + r0, n_out);
        continue;
      }
      for (int64_t r = 0; r < n_rows; ++r) {
        const float* scales = scale_inv + ((r0 + r) / block) * scale_cols;
        const float* row = rows + r * in;
        for (int64_t t = 0; t < T; ++t) {
          const float* xt = x.data<float>() + t * in;
          float y = 0;
          for (int64_t c = 0; c < in; c += block) y += scales[c / block] * dot(row + c, xt + c, std::min(block, in - c));
          out.data<float>()[t * n_out + r0 + r] = bias_f32.empty() ? y : y + bias_f32[size_t(r0 + r)];
        }
      }
    }
  });
}

}  // namespace mere::ops::cpu
