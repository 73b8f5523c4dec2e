// Mixture of experts on CUDA (kernels in moe.cu): the router's top-k, then the
// experts as decode matvecs (up to kMaxMatvecTokens tokens; MLX affine and FP8
// experts on the tensor cores under lever tensor_core_moe_matvec, affine ones
// to 16 tokens under sixteen_token_experts,
// affine_matvec_mma.cu and fp8_matvec_mma.cu) or
// as grouped tensor-core GEMMs over the pairs sorted by expert (prefill).
#include "ops/cuda/cuda_ops.h"

#ifdef MERE_HAVE_CUDA

#include "core/cuda_check.h"
#include "ops/cuda/launchers.h"
#include "ops/cuda/moe_launchers.h"
#include "ops/quantized_ops.h"

namespace mere::ops::cuda {
namespace {

using namespace mere::cuda;

cudaStream_t stream() { return static_cast<cudaStream_t>(cuda_stream()); }

// Rows [first_row + e * stride, + rows) of `w` as expert e's matrix.
ExpertMatrix expert_matrix(const Weight& w, int64_t rows, int64_t first_row, int64_t stride, const char* what) {
  ExpertMatrix m;
  m.rows = rows;
  m.cols = w.cols();
  m.expert_stride = stride;
  switch (w.kind()) {
    case Weight::Kind::dense: {
      const Tensor& t = w.dense();
      m.w = static_cast<const char*>(t.raw()) + first_row * m.cols * int64_t(dtype_size(t.dtype()));
      m.dtype = t.dtype();
      break;
    }
    case Weight::Kind::affine: {
      const AffineWeight& a = w.affine();
      const int64_t groups = m.cols / a.group_size, scale_size = int64_t(dtype_size(a.scales.dtype()));
      m.w = a.packed.data<uint32_t>() + first_row * (m.cols * a.bits / 32);
      m.scales = static_cast<const char*>(a.scales.raw()) + first_row * groups * scale_size;
      m.biases = static_cast<const char*>(a.biases.raw()) + first_row * groups * scale_size;
      MERE_CHECK(a.scales.dtype() == a.biases.dtype(), "moe_experts (CUDA): {} scales and biases differ in dtype", what);
      m.dtype = a.scales.dtype();
      m.bits = a.bits;
      m.group_size = a.group_size;
      break;
    }
    case Weight::Kind::fp8: {
      const Fp8Weight& f = w.fp8();
      MERE_CHECK(first_row % f.block == 0, "moe_experts (CUDA): {} experts start at row {}, inside an fp8 block of {}",
                 what, first_row, f.block);
      m.w = static_cast<const uint8_t*>(f.values.raw()) + first_row * m.cols;
      m.scales = f.scale_inv.data<float>() + first_row / f.block * ((m.cols + f.block - 1) / f.block);
      m.dtype = DType::f8_e4m3;
      m.group_size = f.block;
      break;
    }
    default:
      fail("moe_experts (CUDA): {} experts are {}; the GPU runs dense, MLX affine (int4, int8) and fp8 experts", what,
           w.describe());
  }
  MERE_CHECK(moe_matrix_supported(m), "moe_experts (CUDA): {} experts ({}, {} rows an expert, {} columns) are not "
             "supported: columns must be a multiple of 32, affine groups 32, 64 or 128, fp8 blocks 128 and each "
             "expert's rows whole blocks", what, w.describe(), m.rows, m.cols);
  return m;
}

MoeRouteArgs route_args(const Tensor& logits, const MoeRouting& r, const Tensor& correction, MoeChoice& choice) {
  MoeRouteArgs a{.logits = logits.data<float>(), .correction = correction.defined() ? correction.data<float>() : nullptr,
                 .ids = choice.ids.data<int32_t>(), .weights = choice.weights.data<float>(), .T = logits.dim(0),
                 .E = int(logits.dim(1)), .k = r.top_k, .n_groups = r.n_groups, .top_groups = r.top_groups,
                 .sigmoid = r.score == MoeRouting::Score::sigmoid, .renormalize = r.renormalize, .scale = r.scale};
  MERE_CHECK(a.E <= kMaxRoutedExperts && a.k <= 32, "moe_route (CUDA): {} experts, top {} (at most {} and 32)", a.E,
             a.k, kMaxRoutedExperts);
  return a;
}

MoeExpertsArgs experts_args(const Tensor& x, const ExpertWeights& w, const MoeChoice& choice, Tensor& out) {
  const int64_t f = w.d_ff, d = w.d_model;
  MoeExpertsArgs a;
  if (w.fused()) {
    a.gate = expert_matrix(w.gate_up, f, 0, 2 * f, "gate");
    a.up = expert_matrix(w.gate_up, f, f, 2 * f, "up");
  } else {
    a.gate = expert_matrix(w.gate, f, 0, f, "gate");
    a.up = expert_matrix(w.up, f, 0, f, "up");
  }
  a.down = expert_matrix(w.down, d, 0, d, "down");
  MERE_CHECK(d % 32 == 0 && f % 32 == 0, "moe_experts (CUDA): d_model {} and d_ff {} must be multiples of 32", d, f);
  a.x = x.data<float>();
  a.ids = choice.ids.data<int32_t>();
  a.weights = choice.weights.data<float>();
  a.out = out.data<float>();
  a.T = x.dim(0);
  a.k = choice.ids.dim(1);
  a.n_experts = w.n_experts;
  a.d_model = d;
  a.d_ff = f;
  return a;
}

// Whether a step of a.T tokens may take the tensor-core experts: 1-8 tokens
// under lever tensor_core_moe_matvec, and affine experts 9-16 under
// sixteen_token_experts (else the grouped GEMMs take those).
bool tensor_core_experts_take(const MoeExpertsArgs& a) {
  if (!tensor_core_moe_matvec_enabled()) return false;
  if (a.T <= kMaxMatvecTokens) return true;
  return a.T <= kMaxTensorCoreMatvecTokens && sixteen_token_experts_enabled() && a.gate.dtype != DType::f8_e4m3;
}

// The experts of a choice already routed: on the tensor cores (decode), as f32
// matvecs, or as the prefill's grouped GEMMs.
void run_experts(const MoeExpertsArgs& a) {
  // f32 experts (test checkpoints) keep f32 arithmetic at every T: the GEMM's bf16
  // operands would move a near-tie in a later layer's routing.
  const bool f32_experts = a.gate.bits == 0 && a.gate.dtype == DType::f32;
  if (tensor_core_experts_take(a)) {
    const bool fp8 = a.gate.dtype == DType::f8_e4m3;  // else MLX affine (the supports checks refuse dense)
    if (fp8 ? moe_experts_fp8_mma_supports(a) : moe_experts_mma_supports(a)) {
      const int64_t bytes = fp8 ? moe_experts_fp8_mma_scratch_bytes(a) : moe_experts_mma_scratch_bytes(a);
      Tensor scratch = Tensor::empty({bytes}, DType::u8, Device::cuda);
      MERE_CUDA(fp8 ? launch_moe_experts_fp8_mma(a, scratch.raw(), stream())
                    : launch_moe_experts_mma(a, scratch.raw(), stream()));
      return;
    }
  }
  MERE_CHECK(!a.accumulate && !a.norm_w,
             "moe_experts (CUDA): only the tensor-core affine experts add into the residual or normalize x");
  if (a.T <= kMaxMatvecTokens || f32_experts) {
    MERE_CHECK(a.T * a.k <= 65535, "moe_experts (CUDA): {} tokens x {} experts in one f32 call (at most 65535)", a.T,
               a.k);
    Tensor act = Tensor::empty({a.T * a.k, a.d_ff}, DType::f32, Device::cuda);
    MERE_CUDA(launch_moe_experts_decode(a, act.data<float>(), stream()));
    return;
  }
  Tensor scratch =
      Tensor::empty({int64_t(moe_prefill_scratch_bytes(a))}, DType::u8, Device::cuda);
  MERE_CUDA(launch_moe_experts_prefill(a, scratch.raw(), stream()));
}

// Whether run_experts takes the tensor-core affine experts (which alone add
// into the residual and normalize it).
bool affine_experts_on_tensor_cores(const MoeExpertsArgs& a) {
  return tensor_core_experts_take(a) && a.gate.dtype != DType::f8_e4m3 && moe_experts_mma_supports(a);
}

// Whether run_experts takes the tensor-core experts, affine or FP8 (whose
// gate/up routes where a.route is set).
bool experts_on_tensor_cores(const MoeExpertsArgs& a) {
  if (a.gate.dtype != DType::f8_e4m3) return affine_experts_on_tensor_cores(a);
  return tensor_core_experts_take(a) && moe_experts_fp8_mma_supports(a);
}

// The routing, then the experts: under lever routing_in_experts the tensor-core
// experts' gate/up routes, else the routing kernel runs first.
void route_and_run_experts(MoeExpertsArgs a, const MoeRouteArgs& route) {
  if (routing_in_experts_enabled()) {
    a.route = route;
    if (experts_on_tensor_cores(a)) return run_experts(a);
    a.route = MoeRouteArgs{};
  }
  MERE_CUDA(launch_moe_route(route, stream()));
  run_experts(a);
}

}  // namespace

void moe_route(const Tensor& logits, const MoeRouting& r, const Tensor& correction, MoeChoice& choice) {
  MERE_CUDA(launch_moe_route(route_args(logits, r, correction, choice), stream()));
}

void moe_experts(const Tensor& x, const ExpertWeights& w, const MoeChoice& choice, Tensor& out) {
  run_experts(experts_args(x, w, choice, out));
}

void moe_routed_experts(const Tensor& x, const ExpertWeights& w, const Tensor& logits, const MoeRouting& r,
                        const Tensor& correction, MoeChoice& choice, Tensor& out) {
  route_and_run_experts(experts_args(x, w, choice, out), route_args(logits, r, correction, choice));
}

bool moe_routed_experts_add(Tensor& h, const Tensor& x, const ExpertWeights& w, const Tensor& logits,
                            const MoeRouting& r, const Tensor& correction, MoeChoice& choice) {
  MoeExpertsArgs a = experts_args(x, w, choice, h);
  a.accumulate = true;
  if (!affine_experts_on_tensor_cores(a)) return false;
  route_and_run_experts(a, route_args(logits, r, correction, choice));
  return true;
}

// The most tokens whose experts normalize h themselves where the router takes the tensor cores.
constexpr int64_t kMaxNormedTensorCoreRouterTokens = 4;

bool moe_normed_experts_add(Tensor& h, const Tensor& norm_w, float eps, const Weight& router,
                            const ExpertWeights& w, Tensor& logits, const MoeRouting& r, const Tensor& correction,
                            MoeChoice& choice) {
  if (router.kind() != Weight::Kind::affine) return false;
  MoeExpertsArgs a = experts_args(h, w, choice, h);
  a.accumulate = true;
  a.norm_w = norm_w.raw();
  a.norm_dtype = norm_w.dtype();  // the experts and the router refuse all but f32, f16 and bf16
  a.eps = eps;
  if (!affine_experts_on_tensor_cores(a)) return false;
  if (affine_linear_on_tensor_cores(router.affine(), router.cols(), h.dim(0))) {
    // From 2 tokens the router's product takes the tensor cores, whose prepare
    // kernel normalizes h (the CUDA-core form measured slower there: Qwen3-30B-A3B
    // int4 at 8 tokens -16%, docs/benchmarks.md). Those kernels let the next one
    // start before their waits, so the experts' prepare normalizes h after its own.
    // Past 4 tokens the composition was as fast or faster (int4 at 8 tokens: the
    // fold -1.9%).
    if (h.dim(0) > kMaxNormedTensorCoreRouterTokens) return false;
    a.x_final = false;
    if (!affine_rms_norm_linear(h, norm_w, eps, router.affine(), Tensor(), logits)) return false;
  } else {
    // The router lets the next kernel start only after its wait, when h is final.
    a.x_final = true;
    if (!affine_cuda_core_rms_norm_linear(h, norm_w, eps, router.affine(), Tensor(), logits, /*allow_after_wait=*/true))
      return false;
  }
  route_and_run_experts(a, route_args(logits, r, correction, choice));
  return true;
}

void add_gated(Tensor& out, const Tensor& y, const Tensor& gate) {
  MERE_CUDA(launch_add_gated(out.data<float>(), y.data<float>(), gate.defined() ? gate.data<float>() : nullptr,
                             out.dim(0), out.dim(1), stream()));
}

}  // namespace mere::ops::cuda

#else  // no CUDA backend: unreachable, since no tensor can live on the GPU

namespace mere::ops::cuda {

void moe_route(const Tensor&, const MoeRouting&, const Tensor&, MoeChoice&) {
  fail("this binary was built without the CUDA backend");
}
void moe_experts(const Tensor&, const ExpertWeights&, const MoeChoice&, Tensor&) {
  fail("this binary was built without the CUDA backend");
}
void moe_routed_experts(const Tensor&, const ExpertWeights&, const Tensor&, const MoeRouting&, const Tensor&,
                        MoeChoice&, Tensor&) {
  fail("this binary was built without the CUDA backend");
}
bool moe_routed_experts_add(Tensor&, const Tensor&, const ExpertWeights&, const Tensor&, const MoeRouting&,
                            const Tensor&, MoeChoice&) {
  return false;
}
bool moe_normed_experts_add(Tensor&, const Tensor&, float, const Weight&, const ExpertWeights&, Tensor&,
                            const MoeRouting&, const Tensor&, MoeChoice&) {
  return false;
}
void add_gated(Tensor&, const Tensor&, const Tensor&) { fail("this binary was built without the CUDA backend"); }

}  // namespace mere::ops::cuda

#endif
