// Mixture-of-experts ops: argument checks, then the CPU reference (ops/cpu/moe.cpp)
// or the CUDA kernels (ops/cuda/moe_ops.cpp).
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"

namespace mere::ops {
namespace {

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  MERE_CHECK(!b.defined() || a.device() == b.device(), "{}: operands on different devices", op);
}

// The routing's arguments checked; the choice's tensors for T tokens.
MoeChoice checked_choice(const Tensor& logits, const MoeRouting& routing, const Tensor& correction) {
  MERE_CHECK(logits.dtype() == DType::f32 && logits.rank() == 2, "moe_route: logits must be f32 [T, experts], got {} {}",
             dtype_name(logits.dtype()), shape_str(logits.shape()));
  const int64_t T = logits.dim(0), E = logits.dim(1);
  MERE_CHECK(routing.top_k >= 1 && routing.top_k <= E, "moe_route: top_k {} of {} experts", routing.top_k, E);
  MERE_CHECK(routing.n_groups >= 1 && E % routing.n_groups == 0 && routing.top_groups >= 1 &&
                 routing.top_groups <= routing.n_groups &&
                 int64_t(routing.top_k) <= E / routing.n_groups * routing.top_groups,
             "moe_route: {} experts in {} groups, top {} groups, top {} experts do not fit", E, routing.n_groups,
             routing.top_groups, routing.top_k);
  MERE_CHECK(!correction.defined() || (correction.dtype() == DType::f32 && correction.shape() == Shape{E}),
             "moe_route: correction must be f32 [{}]", E);
  check_same_device("moe_route", logits, correction);
  return MoeChoice{Tensor::empty({T, routing.top_k}, DType::i32, logits.device()),
                   Tensor::empty({T, routing.top_k}, DType::f32, logits.device())};
}

// The experts' arguments checked against x and the choice's shapes.
void check_experts(const Tensor& x, const ExpertWeights& experts, const MoeChoice& choice) {
  const int64_t E = experts.n_experts, f = experts.d_ff, d = experts.d_model;
  MERE_CHECK(x.dtype() == DType::f32 && x.rank() == 2 && x.dim(1) == d, "moe_experts: x {} {} for d_model {}",
             dtype_name(x.dtype()), shape_str(x.shape()), d);
  if (experts.fused())
    MERE_CHECK(experts.gate_up.rows() == E * 2 * f && experts.gate_up.cols() == d,
               "moe_experts: fused gate_up is [{}, {}], expected [{}, {}]", experts.gate_up.rows(),
               experts.gate_up.cols(), E * 2 * f, d);
  else
    for (const Weight* w : {&experts.gate, &experts.up})
      MERE_CHECK(w->rows() == E * f && w->cols() == d, "moe_experts: gate/up is [{}, {}], expected [{}, {}]",
                 w->rows(), w->cols(), E * f, d);
  MERE_CHECK(experts.down.rows() == E * d && experts.down.cols() == f,
             "moe_experts: down is [{}, {}], expected [{}, {}]", experts.down.rows(), experts.down.cols(), E * d, f);
  const int64_t T = x.dim(0);
  MERE_CHECK(choice.ids.dtype() == DType::i32 && choice.ids.rank() == 2 && choice.ids.dim(0) == T &&
                 choice.weights.dtype() == DType::f32 && choice.weights.shape() == choice.ids.shape(),
             "moe_experts: ids {} {} and weights {} {} for {} tokens", dtype_name(choice.ids.dtype()),
             shape_str(choice.ids.shape()), dtype_name(choice.weights.dtype()), shape_str(choice.weights.shape()), T);
  check_same_device("moe_experts", x, choice.ids);
  check_same_device("moe_experts", x, choice.weights);
  MERE_CHECK(experts.down.device() == x.device(), "moe_experts: experts and x on different devices");
}

// Those checks; the output.
Tensor checked_output(const Tensor& x, const ExpertWeights& experts, const MoeChoice& choice) {
  check_experts(x, experts, choice);
  return Tensor::empty({x.dim(0), experts.d_model}, DType::f32, x.device());
}

// The routing's and the experts' checks for x's tokens; the choice's tensors.
MoeChoice checked_routed_choice(const Tensor& x, const ExpertWeights& experts, const Tensor& logits,
                                const MoeRouting& routing, const Tensor& correction) {
  MoeChoice choice = checked_choice(logits, routing, correction);
  MERE_CHECK(logits.dim(0) == x.dim(0), "moe_routed_experts: logits for {} tokens, x for {}", logits.dim(0), x.dim(0));
  check_experts(x, experts, choice);
  check_same_device("moe_routed_experts", x, logits);
  return choice;
}

// The choice, then the experts into out: on the CPU in turn, on the GPU as
// cuda::moe_routed_experts decides (routing in the experts where it can).
void route_and_run(const Tensor& x, const ExpertWeights& experts, const Tensor& logits, const MoeRouting& routing,
                   const Tensor& correction, MoeChoice& choice, Tensor& out) {
  switch (x.device()) {
    case Device::cpu:
      cpu::moe_route(logits, routing, correction, choice);
      cpu::moe_experts(x, experts, choice, out);
      break;
    case Device::cuda: cuda::moe_routed_experts(x, experts, logits, routing, correction, choice, out); break;
  }
}

}  // namespace

uint64_t ExpertWeights::size_bytes() const {
  uint64_t bytes = down.size_bytes();
  for (const Weight* w : {&gate, &up, &gate_up})
    if (w->defined()) bytes += w->size_bytes();
  return bytes;
}

Weight ExpertWeights::gate_of(int64_t e) const {
  return fused() ? gate_up.slice_rows(e * 2 * d_ff, e * 2 * d_ff + d_ff) : gate.slice_rows(e * d_ff, (e + 1) * d_ff);
}
Weight ExpertWeights::up_of(int64_t e) const {
  return fused() ? gate_up.slice_rows(e * 2 * d_ff + d_ff, (e + 1) * 2 * d_ff) : up.slice_rows(e * d_ff, (e + 1) * d_ff);
}
Weight ExpertWeights::down_of(int64_t e) const { return down.slice_rows(e * d_model, (e + 1) * d_model); }

MoeChoice moe_route(const Tensor& logits, const MoeRouting& routing, const Tensor& correction) {
  MoeChoice choice = checked_choice(logits, routing, correction);
  switch (logits.device()) {
    case Device::cpu: cpu::moe_route(logits, routing, correction, choice); break;
    case Device::cuda: cuda::moe_route(logits, routing, correction, choice); break;
  }
  return choice;
}

Tensor moe_experts(const Tensor& x, const ExpertWeights& experts, const MoeChoice& choice) {
  Tensor out = checked_output(x, experts, choice);
  switch (x.device()) {
    case Device::cpu: cpu::moe_experts(x, experts, choice, out); break;
    case Device::cuda: cuda::moe_experts(x, experts, choice, out); break;
  }
  return out;
}

Tensor moe_routed_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& logits,
                          const MoeRouting& routing, const Tensor& correction) {
  MoeChoice choice = checked_routed_choice(x, experts, logits, routing, correction);
  Tensor out = Tensor::empty({x.dim(0), experts.d_model}, DType::f32, x.device());
  route_and_run(x, experts, logits, routing, correction, choice, out);
  return out;
}

void moe_routed_experts_add(Tensor& h, const Tensor& x, const ExpertWeights& experts, const Tensor& logits,
                            const MoeRouting& routing, const Tensor& correction) {
  MERE_CHECK(h.dtype() == DType::f32 && h.shape() == Shape({x.dim(0), experts.d_model}),
             "moe_routed_experts_add: h {} {} for {} tokens of {}", dtype_name(h.dtype()), shape_str(h.shape()),
             x.dim(0), experts.d_model);
  check_same_device("moe_routed_experts_add", x, h);
  MoeChoice choice = checked_routed_choice(x, experts, logits, routing, correction);
  if (h.device() == Device::cuda && cuda::moe_routed_experts_add(h, x, experts, logits, routing, correction, choice))
    return;
  Tensor out = Tensor::empty(h.shape(), DType::f32, h.device());
  route_and_run(x, experts, logits, routing, correction, choice, out);
  add_inplace(h, out);
}

void moe_normed_experts_add(Tensor& h, const Tensor& norm_w, float eps, const Weight& router,
                            const ExpertWeights& experts, const MoeRouting& routing, const Tensor& correction) {
  MERE_CHECK(router.defined() && router.cols() == experts.d_model && router.rows() == experts.n_experts,
             "moe_normed_experts_add: router [{}, {}] for {} experts of {}", router.rows(), router.cols(),
             experts.n_experts, experts.d_model);
  MERE_CHECK(norm_w.shape() == Shape{experts.d_model}, "moe_normed_experts_add: norm weight {} for rows of {}",
             shape_str(norm_w.shape()), experts.d_model);
  check_same_device("moe_normed_experts_add", h, norm_w);
  if (h.device() == Device::cuda && router.device() == Device::cuda) {
    Tensor logits = Tensor::empty({h.dim(0), router.rows()}, DType::f32, Device::cuda);
    MoeChoice choice = checked_routed_choice(h, experts, logits, routing, correction);
    if (cuda::moe_normed_experts_add(h, norm_w, eps, router, experts, logits, routing, correction, choice)) return;
  }
  const Tensor x = rms_norm(h, norm_w, eps);
  moe_routed_experts_add(h, x, experts, linear(x, router), routing, correction);
}

void add_gated(Tensor& out, const Tensor& y, const Tensor& gate) {
  MERE_CHECK(out.dtype() == DType::f32 && out.rank() == 2 && y.shape() == out.shape() && y.dtype() == DType::f32,
             "add_gated: y {} {} for out {}", dtype_name(y.dtype()), shape_str(y.shape()), shape_str(out.shape()));
  if (!gate.defined()) return add_inplace(out, y);
  MERE_CHECK(gate.dtype() == DType::f32 && gate.shape() == Shape({out.dim(0), 1}), "add_gated: gate {} for {} rows",
             shape_str(gate.shape()), out.dim(0));
  check_same_device("add_gated", out, y);
  check_same_device("add_gated", out, gate);
  switch (out.device()) {
    case Device::cpu: cpu::add_gated(out, y, gate); break;
    case Device::cuda: cuda::add_gated(out, y, gate); break;
  }
}

}  // namespace mere::ops
