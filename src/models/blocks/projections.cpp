#include "models/blocks/projections.h"

namespace mere {
namespace {

uint64_t bytes_of(std::initializer_list<const Tensor*> tensors) {
  uint64_t n = 0;
  for (const Tensor* t : tensors)
    if (t->defined()) n += t->size_bytes();
  return n;
}

void move_all(Device device, std::initializer_list<Tensor*> tensors) {
  for (Tensor* t : tensors)
    if (t->defined()) *t = t->to_device(device);
}

void move_all(Device device, std::initializer_list<Weight*> weights) {
  for (Weight* w : weights)
    if (w->defined()) *w = w->to_device(device);
}

uint64_t bytes_of(std::initializer_list<const Weight*> weights) {
  uint64_t n = 0;
  for (const Weight* w : weights) n += w->size_bytes();
  return n;
}

}  // namespace

void QkvProjection::to_device(Device device) {
  move_all(device, {&q, &k, &v, &qkv});
  move_all(device, {&q_bias, &k_bias, &v_bias, &qkv_bias});
}

void GatedMlp::to_device(Device device) {
  move_all(device, {&gate, &up, &down, &gate_up});
  move_all(device, {&gate_bias, &up_bias, &down_bias, &gate_up_bias});
}

void QkvProjection::fuse() {
  qkv = Weight::concat_rows({q, k, v});
  if (!qkv.defined()) return;
  if (q_bias.defined()) qkv_bias = ops::concat_rows({q_bias, k_bias, v_bias});
  q_dim_ = q.rows();
  kv_dim_ = k.rows();
  q = k = v = Weight();
  q_bias = k_bias = v_bias = Tensor();
}

std::array<Tensor, 3> QkvProjection::apply(const Tensor& x) const {
  if (!qkv.defined()) return {ops::linear(x, q, q_bias), ops::linear(x, k, k_bias), ops::linear(x, v, v_bias)};
  std::vector<Tensor> parts = ops::split_columns(ops::linear(x, qkv, qkv_bias), {q_dim_, kv_dim_, kv_dim_});
  return {parts[0], parts[1], parts[2]};
}

std::array<Tensor, 3> QkvProjection::apply_normed(const Tensor& h, const Tensor& norm_w, float eps) const {
  if (!qkv.defined())
    return {ops::rms_norm_linear(h, norm_w, eps, q, q_bias), ops::rms_norm_linear(h, norm_w, eps, k, k_bias),
            ops::rms_norm_linear(h, norm_w, eps, v, v_bias)};
  std::vector<Tensor> parts =
      ops::split_columns(ops::rms_norm_linear(h, norm_w, eps, qkv, qkv_bias), {q_dim_, kv_dim_, kv_dim_});
  return {parts[0], parts[1], parts[2]};
}

uint64_t QkvProjection::size_bytes() const {
  return bytes_of({&q, &k, &v, &qkv}) + bytes_of({&q_bias, &k_bias, &v_bias, &qkv_bias});
}

void GatedMlp::fuse() {
  gate_up = Weight::concat_rows({gate, up});
  if (!gate_up.defined()) return;
  if (gate_bias.defined()) gate_up_bias = ops::concat_rows({gate_bias, up_bias});
  gate = up = Weight();
  gate_bias = up_bias = Tensor();
}

Tensor GatedMlp::apply(const Tensor& x) const {
  if (gate_up.defined()) return ops::swiglu_linear(ops::linear(x, gate_up, gate_up_bias), down, down_bias);
  return ops::linear(ops::silu_mul(ops::linear(x, gate, gate_bias), ops::linear(x, up, up_bias)), down, down_bias);
}

void GatedMlp::add_normed(Tensor& h, const Tensor& norm_w, float eps) const {
  if (gate_up.defined()) {
    ops::swiglu_linear_add(h, ops::rms_norm_linear(h, norm_w, eps, gate_up, gate_up_bias), down, down_bias);
    return;
  }
  Tensor hidden = ops::silu_mul(ops::rms_norm_linear(h, norm_w, eps, gate, gate_bias),
                                ops::rms_norm_linear(h, norm_w, eps, up, up_bias));
  ops::linear_add(h, hidden, down, down_bias);
}

uint64_t GatedMlp::size_bytes() const {
  return bytes_of({&gate, &up, &down, &gate_up}) + bytes_of({&gate_bias, &up_bias, &down_bias, &gate_up_bias});
}

}  // namespace mere
