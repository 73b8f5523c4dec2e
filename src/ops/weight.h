// The weight of a linear layer, [out, in], in one of the storage kinds we run:
// dense (f32/f16/bf16), MLX affine-quantized (4 or 8 bits per weight with a
// scale and bias per group), or FP8 E4M3 with one scale per 128x128 block.
// ops::linear and the others dispatch on the kind; nothing converts silently.
#pragma once

#include <optional>
#include <variant>

#include "core/tensor.h"

namespace mere {

// MLX's affine quantization: w[o, i] = scales[o, i / g] * q[o, i] + biases[o, i / g],
// q unsigned in [0, 2^bits). `packed` holds 32 / bits values per u32 word, the
// first in the lowest bits.
struct AffineWeight {
  Tensor packed;          // u32 [out, in * bits / 32]
  Tensor scales, biases;  // [out, in / group_size], f32/f16/bf16
  int bits = 0, group_size = 0;
};

// FP8 E4M3 with block scales (DeepSeek-V3, Qwen3 FP8): w[o, i] = value[o, i] *
// scale_inv[o / block, i / block].
struct Fp8Weight {
  Tensor values;     // f8_e4m3 [out, in]
  Tensor scale_inv;  // f32 [ceil(out / block), ceil(in / block)]
  int block = 128;
};

class Weight {
 public:
  enum class Kind { none, dense, affine, fp8 };

  Weight() = default;
  Weight(Tensor dense);  // NOLINT: a dense tensor is a weight
  Weight(AffineWeight affine, int64_t in);
  Weight(Fp8Weight fp8);

  Kind kind() const;
  bool defined() const { return kind() != Kind::none; }
  bool is_dense() const { return kind() == Kind::dense; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  Device device() const;
  // Bytes read to use the weight once (values, scales and biases).
  uint64_t size_bytes() const;
  // "bf16", "affine int4 g64", "fp8 e4m3 128x128".
  std::string describe() const;

  const Tensor& dense() const;
  const AffineWeight& affine() const;
  const Fp8Weight& fp8() const;

  Weight to_device(Device device) const;
  // The weight as a dense [out, in] tensor of `dtype` on its device: the
  // reference every quantized kernel is checked against.
  Tensor dequantize(DType dtype = DType::f32) const;
  // Rows [begin, end) sharing storage (one expert of a stacked MoE matrix). FP8
  // weights slice at whole scale blocks only (begin a multiple of the block).
  Weight slice_rows(int64_t begin, int64_t end) const;
  // Rows of several weights of one kind and layout stacked (fused projections,
  // an MoE layer's experts) into new storage on `device` (default: the parts');
  // undefined when they cannot be (different kinds, bits or group sizes).
  static Weight concat_rows(const std::vector<Weight>& parts, std::optional<Device> device = {});

 private:
  std::variant<std::monostate, Tensor, AffineWeight, Fp8Weight> storage_;
  int64_t rows_ = 0, cols_ = 0;
};

}  // namespace mere
