// The sparse mixture-of-experts block every MoE family shares: a router that
// picks k experts per token (softmax or sigmoid scores, optional expert groups,
// renormalisation and scaling), the chosen experts' SwiGLU MLPs, and an
// optional shared expert that every token runs, with or without a sigmoid gate.
#pragma once

#include "io/checkpoint.h"
#include "models/blocks/projections.h"
#include "ops/ops.h"
#include "quant/quant_config.h"

namespace mere {

struct MoeBlock {
  Weight router;                // [n_experts, d_model]
  Tensor correction;            // f32 [n_experts], added to scores for choosing only; optional
  ops::MoeRouting routing;
  ops::ExpertWeights experts;
  GatedMlp shared;              // the shared expert; optional (shared.down undefined)
  Weight shared_gate;           // [1, d_model]: shared output times sigmoid(x . gate); optional

  // x f32 [T, d_model] (the normed hidden state) -> [T, d_model].
  Tensor apply(const Tensor& x) const;
  // h += apply(x): on the GPU the tensor-core experts' down adds into h itself.
  void add_to(Tensor& h, const Tensor& x) const;
  // add_to(h, RMSNorm(h) norm_w) for the fused forms (lever fused_norm_matvec):
  // on the GPU the router's matvec and the experts normalize h themselves.
  void add_normed(Tensor& h, const Tensor& norm_w, float eps) const;
  // Bytes one decoded token reads: the router, k experts, the shared expert.
  uint64_t decode_bytes() const;
};

// One layer's experts under `prefix` (e.g. "model.layers.3.mlp."), read from
// the mapped checkpoint straight into stacked matrices on `device`, in
// whichever layout it has: Hugging Face's per-expert `experts.<e>.gate_proj`,
// `up_proj`, `down_proj` (dense, MLX affine or FP8); transformers 5's
// `experts.gate_up_proj` [E, 2 * d_ff, d_model] and `experts.down_proj`; or
// mlx-lm's `switch_mlp.gate_proj` ... stacked [E, d_ff, d_model]. With
// `fuse_gate_up` gate and up become one matrix (ops::ExpertWeights::gate_up).
ops::ExpertWeights load_experts(const Checkpoint& checkpoint, const std::string& prefix, int64_t n_experts,
                                int64_t d_ff, int64_t d_model, const QuantizationConfig& quant, Device device,
                                bool fuse_gate_up);

}  // namespace mere
