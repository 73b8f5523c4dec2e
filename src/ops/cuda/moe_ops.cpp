// Mixture of experts on CUDA (kernels in moe.cu).
#include "ops/cuda/cuda_ops.h"

#ifdef MERE_HAVE_CUDA

#include "core/cuda_check.h"

namespace mere::ops::cuda {

void moe_route(const Tensor&, const MoeRouting&, const Tensor&, MoeChoice&) { fail("moe_route: CUDA not yet"); }
void moe_experts(const Tensor&, const ExpertWeights&, const MoeChoice&, Tensor&) { fail("moe_experts: CUDA not yet"); }
void add_gated(Tensor&, const Tensor&, const Tensor&) { fail("add_gated: CUDA not yet"); }

}  // namespace mere::ops::cuda

#else  // no CUDA backend: unreachable, since no tensor can live on the GPU

namespace mere::ops::cuda {

void moe_route(const Tensor&, const MoeRouting&, const Tensor&, MoeChoice&) {
  fail("this binary was built without the CUDA backend");
}
void moe_experts(const Tensor&, const ExpertWeights&, const MoeChoice&, Tensor&) {
  fail("this binary was built without the CUDA backend");
}
void add_gated(Tensor&, const Tensor&, const Tensor&) { fail("this binary was built without the CUDA backend"); }

}  // namespace mere::ops::cuda

#endif
