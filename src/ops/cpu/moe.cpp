// Mixture of experts on the CPU, the reference: routing per token, then each
// expert's SwiGLU MLP over the rows routed to it, in expert order (as
// transformers' Qwen3MoeSparseMoeBlock loops over the experts hit).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/cpu/cpu_ops.h"

namespace mere::ops::cpu {
namespace {

// The indices of the n largest values, best first; ties go to the lower index.
std::vector<int> best(const std::vector<float>& v, int n) {
  std::vector<int> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + n, order.end(),
                    [&](int a, int b) { return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b); });
  order.resize(size_t(n));
  return order;
}

}  // namespace

void moe_route(const Tensor& logits, const MoeRouting& r, const Tensor& correction, MoeChoice& choice) {
  const int64_t T = logits.dim(0), E = logits.dim(1), group = E / r.n_groups;
  std::vector<float> score(static_cast<size_t>(E)), pick(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits.data<float>() + t * E;
    if (r.score == MoeRouting::Score::softmax) {
      const float m = *std::max_element(l, l + E);
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += score[size_t(e)] = std::exp(l[e] - m);
      for (float& s : score) s /= sum;
    } else {
      for (int64_t e = 0; e < E; ++e) score[size_t(e)] = 1.0f / (1.0f + std::exp(-l[e]));
    }
    for (int64_t e = 0; e < E; ++e)
      pick[size_t(e)] = score[size_t(e)] + (correction.defined() ? correction.data<float>()[e] : 0.0f);
    if (r.n_groups > 1) {  // a group scores the sum of its two best; experts outside the best groups drop out
      std::vector<float> group_score(size_t(r.n_groups));
      for (int g = 0; g < r.n_groups; ++g) {
        std::vector<float> members(pick.begin() + g * group, pick.begin() + (g + 1) * group);
        const std::vector<int> top = best(members, int(std::min<int64_t>(2, group)));
        group_score[size_t(g)] = 0;
        for (int i : top) group_score[size_t(g)] += members[size_t(i)];
      }
      std::vector<bool> kept(size_t(r.n_groups), false);
      for (int g : best(group_score, r.top_groups)) kept[size_t(g)] = true;
      for (int64_t e = 0; e < E; ++e)
        if (!kept[size_t(e / group)]) pick[size_t(e)] = -INFINITY;
    }
    const std::vector<int> top = best(pick, r.top_k);
    float sum = 0;
    for (int i : top) sum += score[size_t(i)];
    for (int j = 0; j < r.top_k; ++j) {
      const float w = score[size_t(top[size_t(j)])];
      choice.ids.data<int32_t>()[t * r.top_k + j] = top[size_t(j)];
      choice.weights.data<float>()[t * r.top_k + j] = (r.renormalize ? w / sum : w) * r.scale;
    }
  }
}

void moe_experts(const Tensor& x, const ExpertWeights& w, const MoeChoice& choice, Tensor& out) {
  const int64_t T = x.dim(0), k = choice.ids.dim(1), d = w.d_model;
  // The (token, slot) pairs routed to each expert.
  std::vector<std::vector<int64_t>> routed(size_t(w.n_experts));
  for (int64_t i = 0; i < T * k; ++i) {
    const int32_t e = choice.ids.data<int32_t>()[i];
    MERE_CHECK(e >= 0 && e < w.n_experts, "moe_experts: expert id {} outside [0, {})", e, w.n_experts);
    routed[size_t(e)].push_back(i);
  }
  std::fill(out.data<float>(), out.data<float>() + out.numel(), 0.0f);
  for (int64_t e = 0; e < w.n_experts; ++e) {
    const std::vector<int64_t>& slots = routed[size_t(e)];
    if (slots.empty()) continue;
    Tensor xe = Tensor::empty({int64_t(slots.size()), d}, DType::f32);
    for (size_t i = 0; i < slots.size(); ++i)
      std::copy_n(x.data<float>() + slots[i] / k * d, d, xe.data<float>() + int64_t(i) * d);
    const Tensor act = w.fused() ? ops::silu_mul_halves(ops::linear(xe, w.gate_up.slice_rows(e * 2 * w.d_ff,
                                                                                                (e + 1) * 2 * w.d_ff)))
                                 : ops::silu_mul(ops::linear(xe, w.gate_of(e)), ops::linear(xe, w.up_of(e)));
    const Tensor y = ops::linear(act, w.down_of(e));
    for (size_t i = 0; i < slots.size(); ++i) {
      const float weight = choice.weights.data<float>()[slots[i]];
      float* o = out.data<float>() + slots[i] / k * d;
      const float* yi = y.data<float>() + int64_t(i) * d;
      for (int64_t c = 0; c < d; ++c) o[c] += weight * yi[c];
    }
  }
}

void add_gated(Tensor& out, const Tensor& y, const Tensor& gate) {
  const int64_t T = out.dim(0), d = out.dim(1);
  for (int64_t t = 0; t < T; ++t) {
    const float g = 1.0f / (1.0f + std::exp(-gate.data<float>()[t]));
    for (int64_t c = 0; c < d; ++c) out.data<float>()[t * d + c] += y.data<float>()[t * d + c] * g;
  }
}

}  // namespace mere::ops::cpu
