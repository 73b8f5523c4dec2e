// FP8 (E4M3, block-scaled) matmul on the CPU.
#include "ops/cpu/cpu_ops.h"
#include "ops/quantized_ops.h"

namespace mere::ops::cpu {

// Reference form until the fused dequantize-dot lands: dequantize, then the dense matmul.
void fp8_linear(const Tensor& x, const Fp8Weight& w, const Tensor& bias, Tensor& out) {
  Tensor dense = Weight(w).dequantize(DType::f32);
  linear(x, dense, bias, out);
}

}  // namespace mere::ops::cpu
