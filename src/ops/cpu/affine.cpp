// MLX affine-quantized matmul on the CPU.
#include "ops/cpu/cpu_ops.h"
#include "ops/quantized_ops.h"

namespace mere::ops::cpu {

// Reference form until the fused dequantize-dot lands: dequantize, then the dense matmul.
void affine_linear(const Tensor& x, const AffineWeight& w, const Tensor& bias, Tensor& out) {
  Tensor dense = Weight(w, x.dim(1)).dequantize(DType::f32);
  linear(x, dense, bias, out);
}

}  // namespace mere::ops::cpu
