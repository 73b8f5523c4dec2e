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

// One group of n values (n even, at most 64) quantized by a whole warp: lane l
// takes values 2l and 2l + 1, the warp finds the range, lane 0 writes the
// group's scale and bias, each lane its codes (8 bits: two bytes; 4 bits: one
// byte, the first value in the low nibble). Every lane of the warp must call it.
__device__ __forceinline__ void quantize_group_warp(const float* vals, int n, int bits, uint8_t* codes,
                                                    uint16_t* scale_out, uint16_t* bias_out, int lane) {
  const bool active = 2 * lane < n;
  const float a = active ? vals[2 * lane] : 0.0f, b = active ? vals[2 * lane + 1] : 0.0f;
  float lo = active ? fminf(a, b) : INFINITY, hi = active ? fmaxf(a, b) : -INFINITY;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, offset));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, offset));
  }
  const int levels = (1 << bits) - 1;
  const float bias = bf16_down(lo);
  float scale = bf16_up((hi - bias) / float(levels));
  if (scale <= 0) scale = bf16_up(1e-8f);  // a constant group: any positive step
  if (lane == 0) {
    *scale_out = bf16_bits(scale);
    *bias_out = bf16_bits(bias);
  }
  if (!active) return;
  const int qa = min(max(int(lroundf((a - bias) / scale)), 0), levels);
  const int qb = min(max(int(lroundf((b - bias) / scale)), 0), levels);
  if (bits == 8) {
    codes[2 * lane] = uint8_t(qa);
    codes[2 * lane + 1] = uint8_t(qb);
  } else {
    codes[lane] = uint8_t(qa | (qb << 4));
  }
}

// A warp's row of head_dim values (in shared memory) into row `dst_row` of an
// affine cache: codes [rows, head_dim * bits / 8], scales and biases [rows, groups]
// (rows counted over positions and heads). Every lane of the warp must call it.
__device__ __forceinline__ void quantize_row_warp(const float* row, int head_dim, int bits, int64_t dst_row,
                                                  uint8_t* codes, uint16_t* scales, uint16_t* biases, int lane) {
  const int group = head_dim < kKvQuantGroup ? head_dim : kKvQuantGroup, n_groups = head_dim / group;
  for (int g = 0; g < n_groups; ++g)
    quantize_group_warp(row + g * group, group, bits, codes + (dst_row * head_dim + int64_t(g) * group) * bits / 8,
                        scales + dst_row * n_groups + g, biases + dst_row * n_groups + g, lane);
}

}  // namespace mere::cuda
