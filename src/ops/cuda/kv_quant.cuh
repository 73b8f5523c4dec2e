// Device helpers of the groupwise affine K/V codes (KV modes affine8/affine4),
// bit-for-bit the CPU reference's arithmetic (ops/cpu/kv_quant.cpp).
#pragma once

#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {

// Round to nearest even, NaN stays NaN: core/dtype.h's f32_to_bf16.
__device__ __forceinline__ uint16_t bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
__device__ __forceinline__ float bf16_value(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }

// bf16 rounding toward -inf / +inf, so the rounded range still covers the group.
__device__ __forceinline__ float bf16_next(float r, bool up) {
  uint16_t bits = bf16_bits(r);
  if (r == 0) bits = up ? 0x0001 : 0x8001;
  else bits = uint16_t((r > 0) == up ? bits + 1 : bits - 1);
  return bf16_value(bits);
}
__device__ __forceinline__ float bf16_down(float x) {
  const float r = bf16_value(bf16_bits(x));
  return r <= x ? r : bf16_next(r, false);
}
__device__ __forceinline__ float bf16_up(float x) {
  const float r = bf16_value(bf16_bits(x));
  return r >= x ? r : bf16_next(r, true);
}

// A warp's row of head_dim values (in shared memory) into row `dst_row` of an
// affine cache: codes [rows, head_dim * bits / 8], scales and biases [rows, groups]
// (rows counted over positions and heads). Lane l takes values 2l and 2l + 1 of
// every group (of n <= 64 values); the groups' ranges are reduced side by side,
// so a row of four groups waits on one chain of shuffles, not four. Lane 0
// writes each group's scale and bias, each lane its codes (8 bits: two bytes; 4
// bits: one byte, the first value in the low nibble). Every lane must call it.
__device__ __forceinline__ void quantize_row_warp(const float* row, int head_dim, int bits, int64_t dst_row,
                                                  uint8_t* codes, uint16_t* scales, uint16_t* biases, int lane) {
  constexpr int kMaxGroups = kMaxAttentionHeadDim / kKvQuantGroup;
  const int n = head_dim < kKvQuantGroup ? head_dim : kKvQuantGroup, n_groups = head_dim / n;
  const bool active = 2 * lane < n;
  float a[kMaxGroups], b[kMaxGroups], lo[kMaxGroups], hi[kMaxGroups];
#pragma unroll
  for (int g = 0; g < kMaxGroups; ++g) {
    const bool on = active && g < n_groups;
    a[g] = on ? row[g * n + 2 * lane] : 0.0f;
    b[g] = on ? row[g * n + 2 * lane + 1] : 0.0f;
    lo[g] = on ? fminf(a[g], b[g]) : INFINITY;
    hi[g] = on ? fmaxf(a[g], b[g]) : -INFINITY;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
#pragma unroll
    for (int g = 0; g < kMaxGroups; ++g) {
      lo[g] = fminf(lo[g], __shfl_xor_sync(0xffffffffu, lo[g], offset));
      hi[g] = fmaxf(hi[g], __shfl_xor_sync(0xffffffffu, hi[g], offset));
    }
  const int levels = (1 << bits) - 1;
#pragma unroll
  for (int g = 0; g < kMaxGroups; ++g) {
    if (g >= n_groups) break;
    const float bias = bf16_down(lo[g]);
    float scale = bf16_up((hi[g] - bias) / float(levels));
    if (scale <= 0) scale = bf16_up(1e-8f);  // a constant group: any positive step
    const int64_t group_index = dst_row * n_groups + g;
    if (lane == 0) {
      scales[group_index] = bf16_bits(scale);
      biases[group_index] = bf16_bits(bias);
    }
    if (!active) continue;
    const int qa = min(max(int(lroundf((a[g] - bias) / scale)), 0), levels);
    const int qb = min(max(int(lroundf((b[g] - bias) / scale)), 0), levels);
    uint8_t* group_codes = codes + (dst_row * head_dim + int64_t(g) * n) * bits / 8;
    if (bits == 8) {
      group_codes[2 * lane] = uint8_t(qa);
      group_codes[2 * lane + 1] = uint8_t(qb);
    } else {
      group_codes[lane] = uint8_t(qa | (qb << 4));
    }
  }
}

}  // namespace mere::cuda
