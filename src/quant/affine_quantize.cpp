// MLX affine quantization, following the kernel `mx.quantize` runs on Apple GPUs,
// where mlx-lm converts models: ml-explore/mlx, mlx/backend/metal/kernels/quantized.h,
// affine_quantize. Per group of g weights, in f32:
//   lo = min(w), hi = max(0, max(w))            (the kernel's maximum starts at 0)
//   scale = max((hi - lo) / (2^bits - 1), 1e-7), negated unless |lo| > |hi|
//   edge = lo if |lo| > |hi| else hi;  q0 = round(edge / scale)
//   if q0 != 0: scale = edge / q0, bias = edge  (the edge and zero land exactly on codes)
//   else:       bias = 0
//   q = min(round((w - bias) / scale), 2^bits - 1), round halves away from zero
// The codes use the f32 scale and bias; the stored ones are then rounded to the
// weight's dtype. MLX's CPU kernel (mlx/backend/cpu/quantized.cpp, quantize) differs
// only where the group is all negative (its maximum starts at -inf) and on exact
// halves (std::rint rounds them to even).
#include "quant/affine_quantize.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"

namespace mere {
namespace {

void store(DType dtype, void* base, int64_t i, float v) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(base)[i] = v; break;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(v); break;
    default: static_cast<uint16_t*>(base)[i] = f32_to_f16(v); break;
  }
}

void load_row(const Tensor& t, int64_t offset, int64_t n, float* dst) {
  switch (t.dtype()) {
    case DType::f32: std::copy(t.data<float>() + offset, t.data<float>() + offset + n, dst); break;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(t.data<uint16_t>()[offset + i]);
      break;
    default:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(t.data<uint16_t>()[offset + i]);
      break;
  }
}

bool is_float(DType dt) { return dt == DType::f32 || dt == DType::f16 || dt == DType::bf16; }

}  // namespace

AffineWeight quantize_affine(const Tensor& dense, int bits, int group_size, DType scale_dtype) {
  MERE_CHECK(bits == 4 || bits == 8, "quantize_affine: bits is {}; 4 or 8 are supported", bits);
  MERE_CHECK(group_size == 32 || group_size == 64 || group_size == 128,
             "quantize_affine: group size is {}; 32, 64 or 128 are supported", group_size);
  MERE_CHECK(dense.rank() == 2 && is_float(dense.dtype()) && dense.device() == Device::cpu,
             "quantize_affine: the weight must be a 2-D f32/f16/bf16 CPU tensor, got {} {} on {}",
             dtype_name(dense.dtype()), shape_str(dense.shape()), dense.device() == Device::cpu ? "cpu" : "cuda");
  MERE_CHECK(is_float(scale_dtype), "quantize_affine: scales cannot be {}", dtype_name(scale_dtype));
  const int64_t out = dense.dim(0), in = dense.dim(1);
  MERE_CHECK(in % group_size == 0, "quantize_affine: {} input columns are not a multiple of the group size {}", in,
             group_size);
  const int64_t groups = in / group_size, per_word = 32 / bits, words = in / per_word;
  const float n_bins = float((1 << bits) - 1);

  AffineWeight a{Tensor::empty({out, words}, DType::u32), Tensor::empty({out, groups}, scale_dtype),
                 Tensor::empty({out, groups}, scale_dtype), bits, group_size};
  uint32_t* packed = a.packed.data<uint32_t>();
  parallel_for(out, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(in));
    for (int64_t r = r0; r < r1; ++r) {
      load_row(dense, r * in, in, row.data());
      std::fill(packed + r * words, packed + (r + 1) * words, 0u);
      for (int64_t g = 0; g < groups; ++g) {
        const float* w = row.data() + g * group_size;
        float lo = w[0], hi = 0;
        for (int i = 0; i < group_size; ++i) {
          lo = std::min(lo, w[i]);
          hi = std::max(hi, w[i]);
        }
        const bool low_edge = std::fabs(lo) > std::fabs(hi);
        float scale = std::max((hi - lo) / n_bins, 1e-7f);
        if (!low_edge) scale = -scale;
        const float edge = low_edge ? lo : hi;
        const float q0 = std::round(edge / scale);
        float bias = 0;
        if (q0 != 0) {
          scale = edge / q0;
          bias = edge;
        }
        for (int i = 0; i < group_size; ++i) {
          const float q = std::clamp(std::round((w[i] - bias) / scale), 0.0f, n_bins);
          const int64_t col = g * group_size + i;
          packed[r * words + col / per_word] |= uint32_t(q) << (bits * (col % per_word));
        }
        store(scale_dtype, a.scales.raw(), r * groups + g, scale);
        store(scale_dtype, a.biases.raw(), r * groups + g, bias);
      }
    }
  });
  return a;
}

}  // namespace mere
