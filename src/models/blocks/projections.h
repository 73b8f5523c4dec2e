// The projections every dense decoder layer has, hiding whether they run as
// separate matmuls or fused over concatenated weights (one launch and one pass
// over the weights instead of three or two: lever fused_projections).
// Fuse before moving to the GPU: concatenating there would leave the separate
// weights' blocks in the device cache.
#pragma once

#include <array>

#include "ops/ops.h"

namespace mere {

// q, k and v from one input.
struct QkvProjection {
  Weight q, k, v;        // [out, d_model]
  Tensor q_bias, k_bias, v_bias;  // optional
  Weight qkv;            // fused: set, and the separate ones dropped
  Tensor qkv_bias;

  void fuse();  // a no-op when the weights cannot be stacked (mixed quantization)
  void to_device(Device device);
  std::array<Tensor, 3> apply(const Tensor& x) const;  // [T, q_dim], [T, kv_dim], [T, kv_dim]
  // The same on rms_norm(h, norm_w, eps), the norm folded into the matmul.
  std::array<Tensor, 3> apply_normed(const Tensor& h, const Tensor& norm_w, float eps) const;
  uint64_t size_bytes() const;
  // Every matrix, fused or separate (the unused ones are empty).
  std::array<const Weight*, 4> matrices() const { return {&qkv, &q, &k, &v}; }

 private:
  int64_t q_dim_ = 0, kv_dim_ = 0;  // the column split of the fused output
};

// down(silu(gate(x)) * up(x)), the SwiGLU MLP.
struct GatedMlp {
  Weight gate, up, down;
  Tensor gate_bias, up_bias, down_bias;
  Weight gate_up;  // fused gate and up
  Tensor gate_up_bias;

  void fuse();  // a no-op when the weights cannot be stacked (mixed quantization)
  void to_device(Device device);
  Tensor apply(const Tensor& x) const;
  // h += apply(rms_norm(h, norm_w, eps)), with the norm, SwiGLU and the residual
  // add folded into the matmuls.
  void add_normed(Tensor& h, const Tensor& norm_w, float eps) const;
  uint64_t size_bytes() const;
  // Every matrix, fused or separate (the unused ones are empty).
  std::array<const Weight*, 4> matrices() const { return {&gate_up, &gate, &up, &down}; }
};

}  // namespace mere
