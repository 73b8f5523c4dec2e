// MLX affine-quantized matmul on the CPU: a fused dequantize-dot. With
// w = scale * q + bias on each group, a group's share of x . w is
//   scale * sum(q * x) + bias * sum(x),
// so the codes are never scaled one by one and sum(x) per group is computed once per
// token. Threads split the output features in blocks of rows, like the dense
// cpu::linear: each block's codes are unpacked to f32 once and reused for every token.
// With lever cpu_tiled_matmul the block is dequantized instead and multiplied in
// register tiles (tiled_rows_product).
#include <algorithm>
#include <vector>

#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/quantized_ops.h"

namespace mere::ops::cpu {
namespace {

// Codes of `n` consecutive weights starting at a word boundary, as floats.
template <int kBits>
void unpack(const uint32_t* words, int64_t n, float* dst) {
  constexpr int kPerWord = 32 / kBits;
  constexpr uint32_t kMask = (1u << kBits) - 1;
  for (int64_t w = 0; w < n / kPerWord; ++w) {
    const uint32_t word = words[w];
#pragma omp simd
    for (int k = 0; k < kPerWord; ++k) dst[w * kPerWord + k] = float((word >> (kBits * k)) & kMask);
  }
}

// sum over groups j of scale[j] * (x . q on group j), for one row of codes. Eight lanes
// of partial sums are kept across groups, so a group costs its multiply-adds and one
// scaling of the lanes, with a single horizontal sum at the end of the row.
template <int kGroup>
float scaled_group_dots(const float* x, const float* q, const float* scales, int64_t groups) {
  constexpr int kLanes = 8;
  static_assert(kGroup % kLanes == 0);
  float row[kLanes] = {};
  for (int64_t j = 0; j < groups; ++j) {
    float acc[kLanes] = {};
    const float* xg = x + j * kGroup;
    const float* qg = q + j * kGroup;
    for (int i = 0; i < kGroup; i += kLanes)
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) acc[l] += xg[i + l] * qg[i + l];
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) row[l] += scales[j] * acc[l];
  }
  float y = 0;
  for (float v : row) y += v;
  return y;
}

float scaled_group_dots(int group_size, const float* x, const float* q, const float* scales, int64_t groups) {
  switch (group_size) {
    case 32: return scaled_group_dots<32>(x, q, scales, groups);
    case 64: return scaled_group_dots<64>(x, q, scales, groups);
    case 128: return scaled_group_dots<128>(x, q, scales, groups);
  }
  float y = 0;  // any other group size the Weight accepts: the plain form
  for (int64_t j = 0; j < groups; ++j) y += scales[j] * dot(x + j * group_size, q + j * group_size, group_size);
  return y;
}

}  // namespace

void affine_linear(const Tensor& x, const AffineWeight& w, const Tensor& bias, Tensor& out) {
  if (vnni_affine_matvec(x, w, bias, out) || direct_affine_matvec(x, w, bias, out)) return;
  const int64_t T = x.dim(0), in = x.dim(1), n_out = w.packed.dim(0);
  const int64_t g = w.group_size, groups = in / g, words = w.packed.dim(1);

  const std::vector<float> bias_f32 = to_f32(bias);
  const bool tiled = tiled_matmul_applies();  // dequantized rows: no bias * sum(x) term
  const std::vector<float> x_sums = tiled ? std::vector<float>() : group_sums(x, g);  // [T, groups]
  const TiledTokens tokens = tiled ? tiled_tokens(x.data<float>(), T, in) : TiledTokens{};
  const int64_t block_rows = tiled_block_rows(tokens, n_out), n_blocks = (n_out + block_rows - 1) / block_rows;
  parallel_for(n_blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    float* codes = thread_scratch(0, size_t(block_rows * in));
    float* scales = thread_scratch(1, size_t(block_rows * groups));
    float* biases = thread_scratch(2, size_t(block_rows * groups));
    for (int64_t b = block_begin; b < block_end; ++b) {
      const int64_t r0 = b * block_rows, r1 = std::min(n_out, r0 + block_rows), rows = r1 - r0;
      const uint32_t* packed = w.packed.data<uint32_t>() + r0 * words;
      if (w.bits == 4)
        unpack<4>(packed, rows * in, codes);
      else
        unpack<8>(packed, rows * in, codes);
      load_f32(w.scales, r0 * groups, rows * groups, scales);
      load_f32(w.biases, r0 * groups, rows * groups, biases);
      if (tiled) {  // the rows dequantized (w = scale * q + bias), then a dense f32 product
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < groups; ++j) {
            const float scale = scales[r * groups + j], shift = biases[r * groups + j];
            float* v = codes + r * in + j * g;
#pragma omp simd
            for (int64_t i = 0; i < g; ++i) v[i] = scale * v[i] + shift;
          }
        const float* block_bias = bias_f32.empty() ? nullptr : bias_f32.data() + r0;
        tiled_rows_product(tokens, codes, rows, block_bias, out.data<float>() + r0, n_out);
        continue;
      }
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x.data<float>() + t * in;
        const float* xs = x_sums.data() + t * groups;
        float* yt = out.data<float>() + t * n_out;
        for (int64_t r = 0; r < rows; ++r) {
          const float* q = codes + r * in;
          const float* s = scales + r * groups;
          const float* z = biases + r * groups;
          const float y = scaled_group_dots(w.group_size, xt, q, s, groups) + dot(z, xs, groups);
          yt[r0 + r] = bias_f32.empty() ? y : y + bias_f32[size_t(r0 + r)];
        }
      }
    }
  });
}

}  // namespace mere::ops::cpu
