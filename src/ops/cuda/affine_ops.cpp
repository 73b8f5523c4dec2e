// MLX affine-quantized matmul and embedding on CUDA.
#include "ops/cuda/cuda_ops.h"
#include "ops/quantized_ops.h"

namespace mere::ops::cuda {

// Reference form until the kernels land: dequantize (through the host), then the dense path.
void affine_linear(const Tensor& x, const AffineWeight& w, const Tensor& bias, Tensor& out) {
  Tensor dense = Weight(w, x.dim(1)).dequantize(DType::bf16);
  linear(x, dense, bias, out);
}

void affine_embed(const AffineWeight& w, const Tensor& ids, Tensor& out) {
  Tensor dense = Weight(w, out.dim(1)).dequantize(DType::bf16);
  embed(dense, ids, out);
}

}  // namespace mere::ops::cuda
