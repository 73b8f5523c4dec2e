// MLX affine-quantized matmul and embedding on CUDA (kernels in
// affine_matvec.cu, affine_matvec_mma.cu and affine_gemm.cu). Decode (up to
// kMaxMatvecTokens rows) runs the quantized matvec, reading the packed weights
// once; short prefills the GEMM that dequantizes its tiles in registers; long
// ones dequantize the weight to a bf16 temporary and run the dense GEMM.
#include "ops/cuda/cuda_ops.h"
#include "ops/quantized_ops.h"

#ifdef MERE_HAVE_CUDA

#include "core/cuda_check.h"
#include "ops/cuda/affine_launchers.h"
#include "ops/cuda/launchers.h"

namespace mere::ops::cuda {
namespace {

using namespace mere::cuda;

cudaStream_t stream() { return static_cast<cudaStream_t>(cuda_stream()); }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Lever tensor_core_affine_matvec applies from 2 tokens, and to one token of a
// matrix this large (all of Llama-3-8B's), where it beats the CUDA-core kernel;
// smaller matrices at one token pay more for its extra launch than they gain
// (a 0.6B model's; Qwen3-30B-A3B's attention at 2^23 weights cost its int8
// decode 8%: docs/levers.md).
constexpr int64_t kMinTensorCoreTokens = 2;
// Where the prepare kernel forms the input itself (RMSNorm, attention's splits
// merged, SwiGLU: the fused forms), it replaces a kernel that would run anyway,
// so matrices from 2^23 weights pay at one token too: Qwen3-30B-A3B's attention
// (2^23.3 and 2^23) folded, int4 decode +8.0% at batch 1 (docs/benchmarks.md).
constexpr int64_t kMinFormedInputWeightsAtOneToken = int64_t(1) << 23;

// Lever int16_activation_matvec applies from 2 tokens (four share an mma).
constexpr int64_t kMinInt16Tokens = 2;

bool tensor_cores_pay(const AffineArgs& a, int64_t T, bool formed_input) {
  return T >= kMinTensorCoreTokens ||
         a.out * a.in >= (formed_input ? kMinFormedInputWeightsAtOneToken : kMinTensorCoreWeightsAtOneToken);
}

// The raw form of the weight, checked for what every kernel needs.
AffineArgs affine_args(const AffineWeight& w, int64_t in, const char* op) {
  MERE_CHECK(w.group_size == 32 || w.group_size == 64 || w.group_size == 128,
             "{} (CUDA): affine group size {} (32, 64 or 128 run on the GPU)", op, w.group_size);
  const DType dt = w.scales.dtype();
  MERE_CHECK(dt == w.biases.dtype() && (dt == DType::f32 || dt == DType::f16 || dt == DType::bf16),
             "{} (CUDA): affine scales {} and biases {} must be one float dtype", op, dtype_name(w.scales.dtype()),
             dtype_name(w.biases.dtype()));
  MERE_CHECK(aligned16(w.packed.raw()), "{} (CUDA): the packed weights are not 16-byte aligned", op);
  AffineArgs a;
  a.packed = w.packed.data<uint32_t>();
  a.scales = w.scales.raw();
  a.biases = w.biases.raw();
  a.scale_dtype = w.scales.dtype();
  a.bits = w.bits;
  a.group_size = w.group_size;
  a.in = in;
  a.out = w.packed.dim(0);
  return a;
}

// Lever tensor_core_affine_gemm takes prefills of up to 384 tokens of matrices
// of 2^24 weights or more. The GEMM that dequantizes its tiles skips the bf16
// copy of each weight (written, then read by cuBLAS): Llama-3-8B pp64 +52%
// (int8) / +48% (int4), pp256 +10% / +14%, batched decode of 16 and 32
// sequences +58-63%; at 512 tokens even, and beyond that the copy and cuBLAS
// win (pp4096 -19% / -16% with the GEMM). A 0.6B model's matrices fill too few
// of its 128-row blocks to pay: pp64 0 / +5%, pp256 -25% / -21% (H200,
// docs/benchmarks.md).
constexpr int64_t kMaxAffineGemmTokens = 384;
constexpr int64_t kMinAffineGemmWeights = int64_t(1) << 24;

bool affine_gemm_pays(const AffineArgs& a, int64_t T) {
  return T <= kMaxAffineGemmTokens && a.out * a.in >= kMinAffineGemmWeights;
}

// x in two digits (15 bits) under lever int16_activation_matvec, else three
// (23 bits). One token keeps three: it takes one mma either way, and two
// digits there measured 2.5-3% slower at batch 1 (docs/benchmarks.md).
int digits_for(int64_t T) { return int16_activation_matvec_enabled() && T >= kMinInt16Tokens ? 2 : 3; }

// Whether lever tensor_core_affine_matvec takes T tokens of this matrix: up to
// kMaxMatvecTokens, and 9 to kMaxTensorCoreMatvecTokens in two digits under
// lever sixteen_token_matvec (the prefill GEMM takes them otherwise).
bool takes_tensor_cores(const AffineArgs& a, int64_t T, bool formed_input) {
  // int8_activation_matvec, an explicit accuracy trade, wins over this exact form.
  return tensor_core_affine_matvec_enabled() && !int8_activation_matvec_enabled() &&
         (T <= kMaxMatvecTokens || sixteen_token_matvec_enabled()) && tensor_cores_pay(a, T, formed_input) &&
         affine_matvec_mma_supports(a, T, digits_for(T));
}

// The tensor-core matvec where lever tensor_core_affine_matvec applies; false
// where it does not (the caller then runs another kernel). formed_input: the
// input needs a kernel before the matvec anyway (its prepare kernel forms it),
// so the tensor cores pay from smaller matrices.
bool tensor_core_linear(const AffineArgs& a, int64_t T, AffineMmaInput input, const Tensor& bias, float* y,
                        bool accumulate, bool formed_input) {
  input.digits = digits_for(T);
  if (!takes_tensor_cores(a, T, formed_input) || !aligned16(input.x)) return false;
  MERE_CHECK(!bias.defined() || bias.dtype() == DType::f32, "linear (CUDA): bias must be f32, got {}",
             dtype_name(bias.dtype()));
  Tensor scratch = Tensor::empty({affine_matvec_mma_scratch_bytes(a, T, input.digits)}, DType::u8, Device::cuda);
  MERE_CUDA(launch_affine_matvec_mma(a, input, bias.defined() ? bias.data<float>() : nullptr, y, T, scratch.raw(),
                                     stream(), accumulate));
  return true;
}

// Whether the GEMM that dequantizes its tiles takes T tokens (lever
// tensor_core_affine_gemm, where it pays).
bool gemm_takes(const AffineArgs& a, int64_t T) {
  return tensor_core_affine_gemm_enabled() && (affine_gemm_at_every_size() || affine_gemm_pays(a, T)) &&
         affine_gemm_supports(a, T);
}

// Lever formed_gemm_input: where linear takes the bf16 copy of the weight and
// cuBLAS (past the decode matvecs, and past the dequantizing GEMM's tokens or
// where it does not pay), a fused form's input (RMSNorm, SwiGLU) is formed in
// bf16 on its way into cuBLAS, which adds into h: no kernels around it. Steps
// the dequantizing GEMM takes compose: formed there (RMSNorm and SwiGLU in its
// input kernel, the add in its split sums' tail) they measured level or slower
// (FP8 pp64 -2.5%, H100, sixty-seventh session, docs/levers.md).
bool copy_forms_input(const AffineArgs& a, int64_t T) {
  return formed_gemm_input_enabled() && T > kMaxMatvecTokens && !takes_tensor_cores(a, T, false) &&
         !gemm_takes(a, T);
}

bool formed_copy_linear(const AffineArgs& a, int64_t T, const AffineMmaInput& input, const Tensor& bias, float* y,
                        bool accumulate) {
  if (!copy_forms_input(a, T) || (accumulate && bias.defined())) return false;  // formed_dense_linear's rule
  Tensor dense = Tensor::empty({a.out, a.in}, DType::bf16, Device::cuda);
  MERE_CUDA(launch_affine_dequantize(a, dense.raw(), DType::bf16, stream()));
  return formed_dense_linear(input, T, dense, bias, y, accumulate);
}

// The raw form without affine_args' checks: a query answers no where they
// would fail (the kernel's own checks refuse those shapes and dtypes).
AffineArgs raw_args(const AffineWeight& w, int64_t in) {
  return AffineArgs{.packed = static_cast<const uint32_t*>(w.packed.raw()), .scales = w.scales.raw(),
                    .biases = w.biases.raw(), .scale_dtype = w.scales.dtype(), .bits = w.bits,
                    .group_size = w.group_size, .in = in, .out = w.packed.dim(0)};
}

}  // namespace

bool affine_matvec_on_tensor_cores(const AffineWeight& w, int64_t in, int64_t T, bool formed_input) {
  const AffineArgs a = raw_args(w, in);
  // Three digits, the larger image: the answer must not hang on the activation levers' state at load.
  // Past kMaxMatvecTokens only two digits run (lever sixteen_token_matvec, which the caller checks).
  return tensor_cores_pay(a, T, formed_input) && affine_matvec_mma_supports(a, T, T > kMaxMatvecTokens ? 2 : 3);
}

bool affine_linear_on_tensor_cores(const AffineWeight& w, int64_t in, int64_t T) {
  return takes_tensor_cores(raw_args(w, in), T, false);
}

bool affine_gemm_forms_input(const AffineWeight& w, int64_t in, int64_t T) {
  return copy_forms_input(raw_args(w, in), T);
}

bool affine_cuda_core_rms_norm_linear(const Tensor& h, const Tensor& norm_w, float eps, const AffineWeight& w,
                                      const Tensor& bias, Tensor& out, bool allow_after_wait) {
  const AffineArgs a = affine_args(w, h.dim(1), "rms_norm_linear");
  if (!affine_matvec_normed_supports(a, h.dim(0), norm_w.dtype()) || !aligned16(h.raw()) || !aligned16(norm_w.raw()))
    return false;
  MERE_CHECK(!bias.defined() || bias.dtype() == DType::f32, "rms_norm_linear (CUDA): bias must be f32, got {}",
             dtype_name(bias.dtype()));
  const AffineMatvecNorm norm{.w = norm_w.raw(), .dtype = norm_w.dtype(), .eps = eps,
                              .allow_after_wait = allow_after_wait};
  MERE_CUDA(launch_affine_matvec_normed(a, h.data<float>(), norm, bias.defined() ? bias.data<float>() : nullptr,
                                        out.data<float>(), h.dim(0), stream()));
  return true;
}

bool affine_rms_norm_linear(const Tensor& h, const Tensor& norm_w, float eps, const AffineWeight& w, const Tensor& bias,
                            Tensor& out) {
  const DType nd = norm_w.dtype();
  if (nd != DType::f32 && nd != DType::f16 && nd != DType::bf16) return false;
  const AffineMmaInput input{.kind = AffineMmaInput::Kind::rms_normed, .x = h.data<float>(), .norm_w = norm_w.raw(),
                             .norm_dtype = nd, .eps = eps};
  const AffineArgs a = affine_args(w, h.dim(1), "rms_norm_linear");
  return tensor_core_linear(a, h.dim(0), input, bias, out.data<float>(), false, true) ||
         affine_cuda_core_rms_norm_linear(h, norm_w, eps, w, bias, out, false) ||
         formed_copy_linear(a, h.dim(0), input, bias, out.data<float>(), false);
}

bool affine_linear_add(Tensor& h, const Tensor& x, const AffineWeight& w, const Tensor& bias) {
  const AffineArgs a = affine_args(w, x.dim(1), "linear_add");
  const AffineMmaInput input{.x = x.data<float>()};
  return tensor_core_linear(a, x.dim(0), input, bias, h.data<float>(), true, false) ||
         formed_copy_linear(a, x.dim(0), input, bias, h.data<float>(), true);
}

bool affine_swiglu_linear_add(Tensor& h, const Tensor& gate_up, const AffineWeight& w, const Tensor& bias) {
  const AffineArgs a = affine_args(w, gate_up.dim(1) / 2, "swiglu_linear_add");
  const AffineMmaInput input{.kind = AffineMmaInput::Kind::silu_gated, .x = gate_up.data<float>()};
  return tensor_core_linear(a, gate_up.dim(0), input, bias, h.data<float>(), true, true) ||
         formed_copy_linear(a, gate_up.dim(0), input, bias, h.data<float>(), true);
}

bool affine_swiglu_linear(const Tensor& gate_up, const AffineWeight& w, const Tensor& bias, Tensor& out) {
  const AffineArgs a = affine_args(w, gate_up.dim(1) / 2, "swiglu_linear");
  const int64_t T = gate_up.dim(0);
  const AffineMmaInput input{.kind = AffineMmaInput::Kind::silu_gated, .x = gate_up.data<float>()};
  return formed_copy_linear(a, T, input, bias, out.data<float>(), false);
}

bool affine_attention_linear_add(Tensor& h, const AttentionSplits& splits, const AffineWeight& w, const Tensor& bias) {
  if (splits.merged.defined()) {
    // Merged in clusters (lever cluster_attention_merge): the prepare kernel
    // converts the output as it would have merged the partials, one kernel
    // either way, so the formed input's smaller matrices still pay.
    const Tensor& a = splits.merged;  // [T, heads, head_dim]
    return tensor_core_linear(affine_args(w, a.dim(1) * a.dim(2), "attention_linear_add"), a.dim(0),
                              AffineMmaInput{.x = a.data<float>()}, bias, h.data<float>(), true, true);
  }
  const Tensor& o = splits.out;  // [T, heads, splits, head_dim]
  // The prepare kernel merges runs of 8 columns of one head, at most kMaxAttentionSplits splits.
  if (o.dim(3) % 8 != 0 || o.dim(2) > kMaxAttentionSplits) return false;
  const AffineMmaInput input{.kind = AffineMmaInput::Kind::attention_splits, .x = o.data<float>(),
                             .split_max = splits.max.data<float>(), .split_sum = splits.sum.data<float>(),
                             .splits = int(o.dim(2)), .head_dim = int(o.dim(3)), .live_splits = splits.live};
  return tensor_core_linear(affine_args(w, o.dim(1) * o.dim(3), "attention_linear_add"), o.dim(0), input, bias,
                            h.data<float>(), true, true);
}

void affine_linear(const Tensor& x, const AffineWeight& w, const Tensor& bias, Tensor& out) {
  MERE_CHECK(!bias.defined() || bias.dtype() == DType::f32, "linear (CUDA): bias must be f32, got {}",
             dtype_name(bias.dtype()));
  const AffineArgs a = affine_args(w, x.dim(1), "linear");
  const int64_t T = x.dim(0);
  if (tensor_core_linear(a, T, AffineMmaInput{.x = x.data<float>()}, bias, out.data<float>(), false, false)) return;
  if (affine_matvec_supports(a, T) && aligned16(x.raw())) {
    MERE_CUDA(launch_affine_matvec(a, x.data<float>(), bias.defined() ? bias.data<float>() : nullptr,
                                   out.data<float>(), T, stream()));
    return;
  }
  if (gemm_takes(a, T) && aligned16(x.raw())) {
    Tensor scratch = Tensor::empty({affine_gemm_scratch_bytes(a, T)}, DType::u8, Device::cuda);
    MERE_CUDA(launch_affine_gemm(a, x.data<float>(), scratch.raw(), bias.defined() ? bias.data<float>() : nullptr,
                                 out.data<float>(), T, stream()));
    return;
  }
  // Prefill (or an x view off 16-byte alignment): a bf16 copy of the weight, then the dense path.
  Tensor dense = Tensor::empty({a.out, a.in}, DType::bf16, Device::cuda);
  MERE_CUDA(launch_affine_dequantize(a, dense.raw(), DType::bf16, stream()));
  linear(x, dense, bias, out);
}

void affine_embed(const AffineWeight& w, const Tensor& ids, Tensor& out) {
  const AffineArgs a = affine_args(w, out.dim(1), "embed");
  MERE_CUDA(launch_affine_embed(a, ids.data<int32_t>(), ids.numel(), out.data<float>(), stream()));
}

}  // namespace mere::ops::cuda

#else  // no CUDA backend: unreachable, since no tensor can live on the GPU

namespace mere::ops::cuda {

void affine_linear(const Tensor&, const AffineWeight&, const Tensor&, Tensor&) {
  fail("this binary was built without the CUDA backend");
}
void affine_embed(const AffineWeight&, const Tensor&, Tensor&) { fail("this binary was built without the CUDA backend"); }
bool affine_rms_norm_linear(const Tensor&, const Tensor&, float, const AffineWeight&, const Tensor&, Tensor&) {
  return false;
}
bool affine_cuda_core_rms_norm_linear(const Tensor&, const Tensor&, float, const AffineWeight&, const Tensor&, Tensor&,
                                      bool) {
  return false;
}
bool affine_linear_add(Tensor&, const Tensor&, const AffineWeight&, const Tensor&) { return false; }
bool affine_swiglu_linear_add(Tensor&, const Tensor&, const AffineWeight&, const Tensor&) { return false; }
bool affine_swiglu_linear(const Tensor&, const AffineWeight&, const Tensor&, Tensor&) { return false; }
bool affine_attention_linear_add(Tensor&, const AttentionSplits&, const AffineWeight&, const Tensor&) { return false; }
bool affine_matvec_on_tensor_cores(const AffineWeight&, int64_t, int64_t, bool) { return false; }
bool affine_linear_on_tensor_cores(const AffineWeight&, int64_t, int64_t) { return false; }
bool affine_gemm_forms_input(const AffineWeight&, int64_t, int64_t) { return false; }

}  // namespace mere::ops::cuda

#endif
