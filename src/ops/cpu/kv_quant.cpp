// Groupwise affine quantization of K/V rows (KV cache modes affine8/affine4):
// the reference the CUDA kernels (cuda/kv_quant.cu, the quantized attention)
// are tested against.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {
namespace {

// bf16 rounding toward -inf / +inf, so the rounded range still covers the group.
float bf16_next(float r, bool up) {  // r is a bf16 value: its neighbour one step up or down
  uint16_t bits = f32_to_bf16(r);
  if (r == 0) bits = up ? 0x0001 : 0x8001;
  else bits = uint16_t((r > 0) == up ? bits + 1 : bits - 1);
  return bf16_to_f32(bits);
}
float bf16_down(float x) {
  const float r = bf16_to_f32(f32_to_bf16(x));
  return r <= x ? r : bf16_next(r, false);
}
float bf16_up(float x) {
  const float r = bf16_to_f32(f32_to_bf16(x));
  return r >= x ? r : bf16_next(r, true);
}

// One group's values [n] to codes; scale and bias as stored (bf16).
void quantize_group(const float* x, int n, int bits, uint8_t* codes, uint16_t& scale_bits, uint16_t& bias_bits) {
  const int levels = (1 << bits) - 1;
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  const float bias = bf16_down(lo);
  float scale = bf16_up((hi - bias) / float(levels));
  if (scale <= 0) scale = bf16_up(1e-8f);  // a constant group: any positive step
  bias_bits = f32_to_bf16(bias);
  scale_bits = f32_to_bf16(scale);
  for (int i = 0; i < n; ++i) {
    const int q = std::clamp(int(std::lround((x[i] - bias) / scale)), 0, levels);
    if (bits == 8) codes[i] = uint8_t(q);
    else if (i % 2 == 0) codes[i / 2] = uint8_t(q);
    else codes[i / 2] |= uint8_t(q << 4);
  }
}

}  // namespace

void quantize_kv_rows(const Tensor& x, AffineRows& q) {
  const int64_t d = x.dim(2), group = kv_quant_group(d);
  const int64_t groups = x.dim(0) * x.dim(1) * (d / group);
  for (int64_t g = 0; g < groups; ++g)
    quantize_group(x.data<float>() + g * group, int(group), q.bits, q.codes.data<uint8_t>() + g * group * q.bits / 8,
                   q.scales.data<uint16_t>()[g], q.biases.data<uint16_t>()[g]);
}

namespace {

// Groups [g0, g1) of kBits codes into f32: a loop per width, so it vectorizes.
template <int kBits>
void dequantize_groups(const AffineRows& q, int64_t group, int64_t g0, int64_t g1, float* dst) {
  const uint8_t* codes = q.codes.data<uint8_t>();
  for (int64_t g = g0; g < g1; ++g) {
    const float scale = bf16_to_f32(q.scales.data<uint16_t>()[g]), bias = bf16_to_f32(q.biases.data<uint16_t>()[g]);
    const uint8_t* c = codes + g * group * kBits / 8;
    float* d = dst + g * group;
    for (int64_t i = 0; i < group; ++i) {
      const int code = kBits == 8 ? c[i] : (c[i / 2] >> ((i % 2) * 4)) & 0xf;
      d[i] = scale * float(code) + bias;
    }
  }
}

}  // namespace

// A prompt's visible rows (a decode step's attention reads the codes itself,
// attention.cpp): split across the threads.
void dequantize_kv_rows(const AffineRows& q, int64_t n, Tensor& out) {
  const int64_t group = q.head_dim() / q.scales.dim(2), groups = n * q.heads() * q.scales.dim(2);
  parallel_for(groups, std::max<int64_t>(1, 4096 / group), [&](int64_t g0, int64_t g1) {
    if (q.bits == 8)
      dequantize_groups<8>(q, group, g0, g1, out.data<float>());
    else
      dequantize_groups<4>(q, group, g0, g1, out.data<float>());
  });
}

void store_rows(const Tensor& x, AffineRows& dst, int64_t pos) {
  AffineRows q;
  q.bits = dst.bits;
  q.codes = Tensor::empty({x.dim(0), dst.codes.dim(1), dst.codes.dim(2)}, DType::u8);
  q.scales = Tensor::empty({x.dim(0), dst.scales.dim(1), dst.scales.dim(2)}, DType::bf16);
  q.biases = Tensor::empty({x.dim(0), dst.biases.dim(1), dst.biases.dim(2)}, DType::bf16);
  quantize_kv_rows(x, q);
  for (auto [from, to] : {std::pair{&q.codes, &dst.codes}, {&q.scales, &dst.scales}, {&q.biases, &dst.biases}}) {
    const size_t row_bytes = to->size_bytes() / size_t(to->dim(0));
    std::memcpy(static_cast<char*>(to->raw()) + size_t(pos) * row_bytes, from->raw(), from->size_bytes());
  }
}

}  // namespace mere::ops::cpu
