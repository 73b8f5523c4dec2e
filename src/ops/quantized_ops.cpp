#include "ops/quantized_ops.h"

#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"

namespace mere::ops {

void quantized_linear(const Tensor& x, const Weight& w, const Tensor& bias, Tensor& out) {
  const bool gpu = x.device() == Device::cuda;
  switch (w.kind()) {
    case Weight::Kind::affine:
      gpu ? cuda::affine_linear(x, w.affine(), bias, out) : cpu::affine_linear(x, w.affine(), bias, out);
      return;
    case Weight::Kind::fp8:
      gpu ? cuda::fp8_linear(x, w.fp8(), bias, out) : cpu::fp8_linear(x, w.fp8(), bias, out);
      return;
    default: fail("quantized_linear: a {} weight is not quantized", w.describe());
  }
}

bool matvec_on_tensor_cores(const Weight& w, int64_t T, bool formed_input) {
  if (w.device() != Device::cuda) return false;
  // FP8 keeps its 2^24 floor in a fused form: Qwen3-30B-A3B's attention folded at one row lost
  // (-0.8% in the fifty-fourth session, -1.1% in the fifty-sixth: docs/levers.md).
  if (w.kind() == Weight::Kind::fp8) return cuda::fp8_matvec_on_tensor_cores(w.fp8(), T);
  return w.kind() == Weight::Kind::affine && cuda::affine_matvec_on_tensor_cores(w.affine(), w.cols(), T, formed_input);
}

bool gemm_forms_input(const Weight& w, int64_t T) {
  if (w.device() != Device::cuda) return false;
  if (w.is_dense()) return cuda::dense_gemm_forms_input(w.dense(), T);
  if (w.kind() == Weight::Kind::fp8) return cuda::fp8_gemm_forms_input(w.fp8(), T);
  return w.kind() == Weight::Kind::affine && cuda::affine_gemm_forms_input(w.affine(), w.cols(), T);
}

void quantized_embed(const Weight& w, const Tensor& ids, Tensor& out) {
  const int32_t vocab = int32_t(w.rows());
  if (ids.device() == Device::cuda) {
    // Ids are range-checked by the model's embed of the prompt; graphs read them on the device.
    if (w.kind() == Weight::Kind::affine) return cuda::affine_embed(w.affine(), ids, out);
    if (w.kind() == Weight::Kind::fp8) return cuda::fp8_embed(w.fp8(), ids, out);
    fail("quantized_embed: a {} table is not quantized", w.describe());
  }
  // The CPU reference: dequantize the rows one at a time.
  const int64_t d = w.cols();
  for (int64_t t = 0; t < ids.numel(); ++t) {
    const int32_t id = ids.data<int32_t>()[t];
    MERE_CHECK(id >= 0 && id < vocab, "embed: token id {} is outside the vocabulary [0, {})", id, vocab);
    Weight row;
    if (w.kind() == Weight::Kind::affine) {
      AffineWeight a = w.affine();
      a.packed = a.packed.slice_rows(id, id + 1);
      a.scales = a.scales.slice_rows(id, id + 1);
      a.biases = a.biases.slice_rows(id, id + 1);
      row = Weight(std::move(a), d);
    } else {
      MERE_CHECK(w.kind() == Weight::Kind::fp8, "quantized_embed: a {} table is not quantized", w.describe());
      const Fp8Weight& f = w.fp8();
      const int64_t block_row = id / f.block;
      // One row of values with its block row of scales; the row index inside the block no longer matters.
      row = Weight(Fp8Weight{f.values.slice_rows(id, id + 1), f.scale_inv.slice_rows(block_row, block_row + 1), f.block});
    }
    Tensor values = row.dequantize(DType::f32);
    std::copy(values.data<float>(), values.data<float>() + d, out.data<float>() + t * d);
  }
}

}  // namespace mere::ops
