// FP8 (E4M3, 128x128 block scales) matmul and embedding on CUDA. Decode (T <= 8)
// runs the fp8 matvec (fp8_matvec.cu, or on the tensor cores fp8_matvec_mma.cu
// under lever tensor_core_fp8_matvec). Prefill quantizes the activations to E4M3
// with one scale per token and 128 columns and runs cuBLASLt's block-scaled FP8
// GEMM on Hopper's tensor cores: weight scales BLK128x128_32F, activation scales
// VEC128_32F (cuBLAS 12.9+, sm_90). Where cuBLASLt offers no such algorithm (rows
// not a multiple of 16 bytes, another block size) the weight is dequantized to
// bf16 on the GPU and the bf16 GEMM runs; fp8_gemm_path() says which one a shape takes.
#include "ops/cuda/cuda_ops.h"
#include "ops/quantized_ops.h"

#ifdef MERE_HAVE_CUDA


#include <map>
#include <mutex>
#include <tuple>

#include "core/cuda_check.h"
#include "ops/cuda/affine_launchers.h"
#include "ops/cuda/cublaslt.h"
#include "ops/cuda/fp8_launchers.h"
#include "ops/cuda/launchers.h"

namespace mere::ops::cuda {
namespace {

using namespace mere::cuda;

cudaStream_t stream() { return static_cast<cudaStream_t>(cuda_stream()); }

// Lever tensor_core_fp8_gemm's prompt limit. H100, Llama-3-8B fp8, against the
// bf16 copy: pp192 +41%, pp256 +35%, pp320 -5.5%, pp384 -3.6% (sixty-sixth
// session): past 256 tokens the copy's cuBLAS GEMM is faster than the copy costs.
constexpr int64_t kMaxFp8GemmTokens = 256;

// Lever tensor_core_fp8_matvec takes 2-8 tokens, and one token of a matrix of
// kMinTensorCoreWeightsAtOneToken or more (all of Llama-3-8B's: +8% at batch 1;
// the demo model in FP8 decoded 26% slower with the kernel at every T).

Fp8WeightView view_of(const Fp8Weight& w) {
  Fp8WeightView v;
  v.values = w.values.data<uint8_t>();
  v.scale_inv = w.scale_inv.data<float>();
  v.out = w.values.dim(0);
  v.in = w.values.dim(1);
  v.scale_cols = w.scale_inv.dim(1);
  v.block = w.block;
  return v;
}

// The descriptors of one block-scaled FP8 GEMM, Y^T [out, T] = W [in, out]^T X [in, T]
// in cuBLASLt's column-major terms (W and X row-major [out, in] and [T, in]).
struct Fp8GemmDesc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;

  Fp8GemmDesc(int64_t T, int64_t in, int64_t out, cudaDataType_t d_type, const void* w_scales, const void* x_scales) {
    MERE_CUBLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
    const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    MERE_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)));
    MERE_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans)));
    MERE_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
    MERE_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
    MERE_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales)));
    MERE_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof(x_scales)));
    MERE_CUBLAS(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, uint64_t(in), uint64_t(out), in));
    MERE_CUBLAS(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, uint64_t(in), uint64_t(T), in));
    MERE_CUBLAS(cublasLtMatrixLayoutCreate(&d, d_type, uint64_t(out), uint64_t(T), out));
  }
  ~Fp8GemmDesc() {
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(op);
  }
  Fp8GemmDesc(const Fp8GemmDesc&) = delete;
  Fp8GemmDesc& operator=(const Fp8GemmDesc&) = delete;
};

// The algorithm cuBLASLt picks for a shape, and the output dtype it takes (f32,
// else bf16); asked once per shape. All our buffers come from cudaMalloc (256-byte
// aligned), as the heuristic assumes by default.
struct Fp8GemmPlan {
  bool ok = false;
  cudaDataType_t d_type = CUDA_R_32F;
  cublasLtMatmulAlgo_t algo{};
};

Fp8GemmPlan plan_for(int64_t T, int64_t in, int64_t out, int block) {
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, int64_t>, Fp8GemmPlan> plans;
  // 16-byte leading dimensions for every operand (cuBLASLt's FP8 requirement).
  if (block != 128 || in % 16 != 0 || out % 16 != 0) return {};
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = plans.try_emplace({T, in, out});
  if (!fresh) return it->second;
  cublasLtMatmulPreference_t pref;
  MERE_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspaceBytes;
  MERE_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // Any device pointers for the scales: the heuristic reads their modes, not them.
  for (cudaDataType_t d_type : {CUDA_R_32F, CUDA_R_16BF}) {
    Fp8GemmDesc desc(T, in, out, d_type, lt_workspace(), lt_workspace());
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lt_handle(), desc.op, desc.a, desc.b, desc.d, desc.d, pref,
                                                           1, &result, &found);
    if (status == CUBLAS_STATUS_SUCCESS && found > 0) {
      it->second = {true, d_type, result.algo};
      break;
    }
  }
  cublasLtMatmulPreferenceDestroy(pref);
  return it->second;
}

// The weight's scales as BLK128x128_32F reads them: rows of block scales with a
// leading dimension padded to a multiple of 4.
Tensor lt_weight_scales(const Fp8Weight& w) {
  const int64_t rows = w.scale_inv.dim(0), cols = w.scale_inv.dim(1), ld = (cols + 3) / 4 * 4;
  if (ld == cols) return w.scale_inv;
  Tensor padded = Tensor::zeros({rows, ld}, DType::f32, Device::cuda);
  MERE_CUDA(cudaMemcpy2DAsync(padded.raw(), size_t(ld) * 4, w.scale_inv.raw(), size_t(cols) * 4, size_t(cols) * 4,
                              size_t(rows), cudaMemcpyDeviceToDevice, stream()));
  return padded;
}

// Tokens padded to a multiple of 16: cuBLASLt offers no block-scaled algorithm
// for some counts (17, say); the padding rows are zeros and are not copied out.
int64_t padded_tokens(int64_t T) { return (T + 15) / 16 * 16; }

// out [T, n_out] = x w^T on the FP8 tensor cores; false when cuBLASLt has no algorithm.
bool fp8_gemm(const Tensor& x, const Fp8Weight& w, Tensor& out) {
  const int64_t T = x.dim(0), in = x.dim(1), n_out = w.values.dim(0), Tp = padded_tokens(T);
  const Fp8GemmPlan plan = plan_for(Tp, in, n_out, w.block);
  if (!plan.ok) return false;
  Tensor q = Tensor::empty({Tp, in}, DType::u8, Device::cuda);                        // [Tp, in] E4M3
  Tensor q_scales = Tensor::empty({(in + 127) / 128, Tp}, DType::f32, Device::cuda);  // [in / 128, Tp]
  if (Tp != T) {
    MERE_CUDA(cudaMemsetAsync(q.data<uint8_t>() + T * in, 0, size_t((Tp - T) * in), stream()));
    MERE_CUDA(cudaMemsetAsync(q_scales.raw(), 0, q_scales.size_bytes(), stream()));
  }
  MERE_CUDA(launch_fp8_quantize_activations(x.data<float>(), T, in, q.data<uint8_t>(), q_scales.data<float>(), Tp,
                                            stream()));
  Tensor w_scales = lt_weight_scales(w);
  const bool direct = plan.d_type == CUDA_R_32F && Tp == T;
  Tensor y = direct ? out
                    : Tensor::empty({Tp, n_out}, plan.d_type == CUDA_R_32F ? DType::f32 : DType::bf16, Device::cuda);
  Fp8GemmDesc desc(Tp, in, n_out, plan.d_type, w_scales.raw(), q_scales.raw());
  const float alpha = 1, beta = 0;
  MERE_CUBLAS(cublasLtMatmul(lt_handle(), desc.op, &alpha, w.values.raw(), desc.a, q.raw(), desc.b, &beta, y.raw(),
                             desc.d, y.raw(), desc.d, &plan.algo, lt_workspace(), kWorkspaceBytes, stream()));
  if (!direct)  // the first T rows of y are out's
    MERE_CUDA(launch_convert(y.raw(), y.dtype(), out.raw(), DType::f32, out.numel(), stream()));
  return true;
}

// Whether the tensor-core matvec takes T tokens of w (as the lever allows): from
// 2 tokens, and one token of a large matrix.
bool tensor_cores_take(const Fp8WeightView& v, int64_t T) {
  return (T >= 2 || v.out * v.in >= kMinTensorCoreWeightsAtOneToken) && fp8_matvec_mma_supports(v, T);
}

// The tensor-core matvec of `input` where the lever takes it, into y (added to
// it with accumulate); false, with nothing run, where it does not.
bool tensor_core_linear(const Fp8Weight& w, int64_t T, const MmaInput& input, const Tensor& bias, float* y,
                        bool accumulate) {
  const Fp8WeightView v = view_of(w);
  if (T > kMaxFp8MatvecTokens || !tensor_core_fp8_matvec_enabled() || !tensor_cores_take(v, T) ||
      reinterpret_cast<uintptr_t>(input.x) % 16 != 0)
    return false;
  MERE_CHECK(!bias.defined() || bias.dtype() == DType::f32, "linear (CUDA): bias must be f32, got {}",
             dtype_name(bias.dtype()));
  Tensor scratch = Tensor::empty({fp8_matvec_mma_scratch_bytes(v, T)}, DType::u8, Device::cuda);
  MERE_CUDA(launch_fp8_matvec_mma(input, v, bias.defined() ? bias.data<float>() : nullptr, y, T, scratch.raw(),
                                  stream(), accumulate));
  return true;
}

// Lever tensor_core_fp8_gemm: the GEMM that forms the bf16 weights in
// registers takes 9 to kMaxFp8GemmTokens tokens (the bf16 copy costs every call
// 5 bytes of traffic a weight against 1, which short prompts and batches of 9+
// feel most).
bool gemm_takes(const Fp8WeightView& v, int64_t T) {
  return tensor_core_fp8_gemm_enabled() && T > kMaxFp8MatvecTokens && T <= kMaxFp8GemmTokens &&
         fp8_dequantizing_gemm_supports(v, T);
}

// Lever formed_gemm_input: where linear takes the bf16 copy of the weight and
// cuBLAS (past the matvec's tokens and the dequantizing GEMM's; not under
// fp8_activation_gemm, whose FP8 GEMM quantizes x itself), a fused form's input
// (RMSNorm, SwiGLU) is formed in bf16 on its way into cuBLAS, which adds into
// h. Steps the dequantizing GEMM takes compose (affine_ops.cpp says why).
bool copy_forms_input(const Fp8WeightView& v, int64_t T) {
  return formed_gemm_input_enabled() && !fp8_activation_gemm_enabled() && T > kMaxFp8MatvecTokens &&
         !gemm_takes(v, T);
}

bool formed_copy_linear(const Fp8Weight& w, int64_t T, const MmaInput& input, const Tensor& bias, float* y,
                        bool accumulate) {
  if (!copy_forms_input(view_of(w), T) || (accumulate && bias.defined())) return false;  // formed_dense_linear's rule
  Tensor dense = Tensor::empty(w.values.shape(), DType::bf16, Device::cuda);
  MERE_CUDA(launch_fp8_dequantize(view_of(w), dense.raw(), DType::bf16, stream()));
  return formed_dense_linear(input, T, dense, bias, y, accumulate);
}

}  // namespace
}  // namespace mere::ops::cuda

namespace mere::cuda {

const char* fp8_gemm_path(int64_t T, int64_t in, int64_t out, int block) {
  if (T <= kMaxFp8MatvecTokens) return "fp8 matvec";
  if (!fp8_activation_gemm_enabled()) return "bf16 dequantized";
  const ops::cuda::Fp8GemmPlan plan = ops::cuda::plan_for(ops::cuda::padded_tokens(T), in, out, block);
  if (!plan.ok) return "bf16 dequantized";
  return plan.d_type == CUDA_R_32F ? "fp8 tensor cores" : "fp8 tensor cores, bf16 out";
}

}  // namespace mere::cuda

namespace mere::ops::cuda {

void fp8_linear(const Tensor& x, const Fp8Weight& w, const Tensor& bias, Tensor& out) {
  MERE_CHECK(!bias.defined() || bias.dtype() == DType::f32, "linear (CUDA): bias must be f32, got {}",
             dtype_name(bias.dtype()));
  const int64_t T = x.dim(0);
  if (T == 0) return;
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  if (T <= kMaxFp8MatvecTokens) {
    if (tensor_core_linear(w, T, MmaInput{.x = x.data<float>()}, bias, out.data<float>(), false)) return;
    MERE_CUDA(launch_fp8_matvec(x.data<float>(), view_of(w), b, out.data<float>(), T, stream()));
    return;
  }
  if (fp8_activation_gemm_enabled() && fp8_gemm(x, w, out)) {
    if (b) MERE_CUDA(launch_add_bias(out.data<float>(), b, T, out.dim(1), stream()));
    return;
  }
  const Fp8WeightView v = view_of(w);
  if (gemm_takes(v, T) && reinterpret_cast<uintptr_t>(x.raw()) % 16 == 0) {
    Tensor scratch = Tensor::empty({fp8_dequantizing_gemm_scratch_bytes(v, T)}, DType::u8, Device::cuda);
    MERE_CUDA(launch_fp8_dequantizing_gemm(v, x.data<float>(), scratch.raw(), b, out.data<float>(), T, stream()));
    return;
  }
  Tensor dense = Tensor::empty(w.values.shape(), DType::bf16, Device::cuda);
  MERE_CUDA(launch_fp8_dequantize(view_of(w), dense.raw(), DType::bf16, stream()));
  linear(x, dense, bias, out);
}

void fp8_embed(const Fp8Weight& w, const Tensor& ids, Tensor& out) {
  MERE_CUDA(launch_fp8_embed(view_of(w), ids.data<int32_t>(), ids.numel(), out.data<float>(), stream()));
}

// The fused decode forms (lever fused_norm_matvec): the prepare kernel forms
// the input as it converts x, and o_proj and down_proj add into h.
bool fp8_rms_norm_linear(const Tensor& h, const Tensor& norm_w, float eps, const Fp8Weight& w, const Tensor& bias,
                         Tensor& out) {
  const DType nd = norm_w.dtype();
  if (nd != DType::f32 && nd != DType::f16 && nd != DType::bf16) return false;
  const MmaInput input{.kind = MmaInput::Kind::rms_normed, .x = h.data<float>(), .norm_w = norm_w.raw(),
                       .norm_dtype = nd, .eps = eps};
  return tensor_core_linear(w, h.dim(0), input, bias, out.data<float>(), false) ||
         formed_copy_linear(w, h.dim(0), input, bias, out.data<float>(), false);
}

bool fp8_linear_add(Tensor& h, const Tensor& x, const Fp8Weight& w, const Tensor& bias) {
  const MmaInput input{.x = x.data<float>()};
  return tensor_core_linear(w, x.dim(0), input, bias, h.data<float>(), true) ||
         formed_copy_linear(w, x.dim(0), input, bias, h.data<float>(), true);
}

bool fp8_swiglu_linear_add(Tensor& h, const Tensor& gate_up, const Fp8Weight& w, const Tensor& bias) {
  const MmaInput input{.kind = MmaInput::Kind::silu_gated, .x = gate_up.data<float>()};
  return tensor_core_linear(w, gate_up.dim(0), input, bias, h.data<float>(), true) ||
         formed_copy_linear(w, gate_up.dim(0), input, bias, h.data<float>(), true);
}

bool fp8_swiglu_linear(const Tensor& gate_up, const Fp8Weight& w, const Tensor& bias, Tensor& out) {
  const MmaInput input{.kind = MmaInput::Kind::silu_gated, .x = gate_up.data<float>()};
  return formed_copy_linear(w, gate_up.dim(0), input, bias, out.data<float>(), false);
}

bool fp8_attention_linear_add(Tensor& h, const AttentionSplits& splits, const Fp8Weight& w, const Tensor& bias) {
  if (splits.merged.defined())  // merged in clusters (lever cluster_attention_merge)
    return fp8_linear_add(h, splits.merged.reshape({splits.merged.dim(0), -1}), w, bias);
  const Tensor& o = splits.out;  // [T, heads, splits, head_dim]
  // A lane's 4 columns within one head; at most kMaxAttentionSplits splits, a warp per 8.
  if (o.dim(3) % 4 != 0 || o.dim(2) > kMaxAttentionSplits) return false;
  const MmaInput input{.kind = MmaInput::Kind::attention_splits, .x = o.data<float>(),
                       .split_max = splits.max.data<float>(), .split_sum = splits.sum.data<float>(),
                       .splits = int(o.dim(2)), .head_dim = int(o.dim(3)), .live_splits = splits.live};
  return tensor_core_linear(w, o.dim(0), input, bias, h.data<float>(), true);
}

bool fp8_matvec_on_tensor_cores(const Fp8Weight& w, int64_t T) { return tensor_cores_take(view_of(w), T); }

bool fp8_gemm_forms_input(const Fp8Weight& w, int64_t T) { return copy_forms_input(view_of(w), T); }

}  // namespace mere::ops::cuda

#else  // no CUDA backend: unreachable, since no tensor can live on the GPU

namespace mere::ops::cuda {

void fp8_linear(const Tensor&, const Fp8Weight&, const Tensor&, Tensor&) {
  fail("this binary was built without the CUDA backend");
}
void fp8_embed(const Fp8Weight&, const Tensor&, Tensor&) { fail("this binary was built without the CUDA backend"); }
bool fp8_rms_norm_linear(const Tensor&, const Tensor&, float, const Fp8Weight&, const Tensor&, Tensor&) { return false; }
bool fp8_linear_add(Tensor&, const Tensor&, const Fp8Weight&, const Tensor&) { return false; }
bool fp8_swiglu_linear_add(Tensor&, const Tensor&, const Fp8Weight&, const Tensor&) { return false; }
bool fp8_swiglu_linear(const Tensor&, const Fp8Weight&, const Tensor&, Tensor&) { return false; }
bool fp8_attention_linear_add(Tensor&, const AttentionSplits&, const Fp8Weight&, const Tensor&) { return false; }
bool fp8_matvec_on_tensor_cores(const Fp8Weight&, int64_t) { return false; }
bool fp8_gemm_forms_input(const Fp8Weight&, int64_t) { return false; }

}  // namespace mere::ops::cuda

#endif
