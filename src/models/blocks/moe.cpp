#include "models/blocks/moe.h"

#include "quant/load_weight.h"

namespace mere {

Tensor MoeBlock::apply(const Tensor& x) const {
  Tensor out = ops::moe_routed_experts(x, experts, ops::linear(x, router), routing, correction);
  if (shared.down.defined())
    ops::add_gated(out, shared.apply(x), shared_gate.defined() ? ops::linear(x, shared_gate) : Tensor());
  return out;
}

void MoeBlock::add_to(Tensor& h, const Tensor& x) const {
  if (shared.down.defined()) return ops::add_inplace(h, apply(x));
  ops::moe_routed_experts_add(h, x, experts, ops::linear(x, router), routing, correction);
}

void MoeBlock::add_normed(Tensor& h, const Tensor& norm_w, float eps) const {
  if (shared.down.defined()) return add_to(h, ops::rms_norm(h, norm_w, eps));
  ops::moe_normed_experts_add(h, norm_w, eps, router, experts, routing, correction);
}

uint64_t MoeBlock::decode_bytes() const {
  const uint64_t per_expert = experts.size_bytes() / uint64_t(experts.n_experts);
  uint64_t bytes = router.size_bytes() + uint64_t(routing.top_k) * per_expert + shared.size_bytes();
  if (correction.defined()) bytes += correction.size_bytes();
  if (shared_gate.defined()) bytes += shared_gate.size_bytes();
  return bytes;
}

ops::ExpertWeights load_experts(const Checkpoint& checkpoint, const std::string& prefix, int64_t n_experts,
                                int64_t d_ff, int64_t d_model, const QuantizationConfig& quant, Device device,
                                bool fuse_gate_up) {
  ops::ExpertWeights w;
  w.n_experts = n_experts;
  w.d_ff = d_ff;
  w.d_model = d_model;
  const Shape up_shape{n_experts, d_ff, d_model}, down_shape{n_experts, d_model, d_ff};
  const char* up_why = "num_experts, moe_intermediate_size, hidden_size";
  const char* down_why = "num_experts, hidden_size, moe_intermediate_size";
  // Gate and up as stacks [E * d_ff, d_model], then laid out as asked.
  Weight gate, up;
  if (checkpoint.has(prefix + "experts.gate_up_proj")) {  // transformers 5: already gate then up per expert
    Tensor gate_up = checkpoint.get(prefix + "experts.gate_up_proj", {n_experts, 2 * d_ff, d_model}, up_why);
    Tensor down = checkpoint.get(prefix + "experts.down_proj", down_shape, down_why);
    w.down = Weight(down.reshape({n_experts * d_model, d_ff})).to_device(device);
    Weight stacked(gate_up.reshape({n_experts * 2 * d_ff, d_model}));
    if (fuse_gate_up) {
      w.gate_up = stacked.to_device(device);
      return w;
    }
    std::vector<Weight> gates, ups;
    for (int64_t e = 0; e < n_experts; ++e) {
      gates.push_back(stacked.slice_rows(e * 2 * d_ff, e * 2 * d_ff + d_ff));
      ups.push_back(stacked.slice_rows(e * 2 * d_ff + d_ff, (e + 1) * 2 * d_ff));
    }
    w.gate = Weight::concat_rows(gates, device);
    w.up = Weight::concat_rows(ups, device);
    return w;
  }
  if (checkpoint.has(prefix + "switch_mlp.down_proj.weight")) {  // mlx-lm: stacked per matrix
    gate = load_weight(checkpoint, prefix + "switch_mlp.gate_proj", up_shape, up_why, quant);
    up = load_weight(checkpoint, prefix + "switch_mlp.up_proj", up_shape, up_why, quant);
    w.down = load_weight(checkpoint, prefix + "switch_mlp.down_proj", down_shape, down_why, quant).to_device(device);
  } else {  // Hugging Face: one module per expert
    std::vector<Weight> gates, ups, downs;
    for (int64_t e = 0; e < n_experts; ++e) {
      const std::string p = prefix + "experts." + std::to_string(e) + ".";
      gates.push_back(load_weight(checkpoint, p + "gate_proj", {d_ff, d_model}, "moe_intermediate_size, hidden_size", quant));
      ups.push_back(load_weight(checkpoint, p + "up_proj", {d_ff, d_model}, "moe_intermediate_size, hidden_size", quant));
      downs.push_back(load_weight(checkpoint, p + "down_proj", {d_model, d_ff}, "hidden_size, moe_intermediate_size", quant));
    }
    w.down = Weight::concat_rows(downs, device);
    MERE_CHECK(w.down.defined(), "{}: the experts of {} are stored in different formats", checkpoint.path().string(),
               prefix);
    if (!fuse_gate_up) {
      w.gate = Weight::concat_rows(gates, device);
      w.up = Weight::concat_rows(ups, device);
      MERE_CHECK(w.gate.defined() && w.up.defined(), "{}: the experts of {} are stored in different formats",
                 checkpoint.path().string(), prefix);
      return w;
    }
    std::vector<Weight> both;
    for (int64_t e = 0; e < n_experts; ++e) {
      both.push_back(gates[size_t(e)]);
      both.push_back(ups[size_t(e)]);
    }
    w.gate_up = Weight::concat_rows(both, device);
    MERE_CHECK(w.gate_up.defined(), "{}: the experts of {} are stored in different formats",
               checkpoint.path().string(), prefix);
    return w;
  }
  // mlx-lm stacks: interleave per expert when fused, else move as they are.
  if (!fuse_gate_up) {
    w.gate = gate.to_device(device);
    w.up = up.to_device(device);
    return w;
  }
  std::vector<Weight> both;
  for (int64_t e = 0; e < n_experts; ++e) {
    both.push_back(gate.slice_rows(e * d_ff, (e + 1) * d_ff));
    both.push_back(up.slice_rows(e * d_ff, (e + 1) * d_ff));
  }
  w.gate_up = Weight::concat_rows(both, device);
  MERE_CHECK(w.gate_up.defined(), "{}: the experts' gate and up of {} are stored in different formats",
             checkpoint.path().string(), prefix);
  return w;
}

}  // namespace mere
