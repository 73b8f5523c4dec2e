// FP8 (E4M3, block-scaled) matmul and embedding on CUDA.
#include "ops/cuda/cuda_ops.h"
#include "ops/quantized_ops.h"

namespace mere::ops::cuda {

// Reference form until the kernels land: dequantize (through the host), then the dense path.
void fp8_linear(const Tensor& x, const Fp8Weight& w, const Tensor& bias, Tensor& out) {
  Tensor dense = Weight(w).dequantize(DType::bf16);
  linear(x, dense, bias, out);
}

void fp8_embed(const Fp8Weight& w, const Tensor& ids, Tensor& out) {
  Tensor dense = Weight(w).dequantize(DType::bf16);
  embed(dense, ids, out);
}

}  // namespace mere::ops::cuda
