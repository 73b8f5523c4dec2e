// Launchers of the mixture-of-experts kernels (moe.cu): raw pointers, sizes and
// a stream. Each returns the launch's cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace mere::cuda {

// A stack of per-expert matrices [rows, cols]: expert e's row r is storage row
// e * expert_stride + r (stride 2 * d_ff for the gate or up half of a fused
// gate/up stack, whose pointers then start at row 0 or d_ff).
struct ExpertMatrix {
  const void* w = nullptr;        // dense values (f32, f16, bf16, f8_e4m3) or affine packed u32
  const void* scales = nullptr;   // affine: [rows, cols / group_size]; fp8: f32 [rows / 128, cols / 128]
  const void* biases = nullptr;
  DType dtype = DType::bf16;      // dense: of w (f8_e4m3: fp8 with block scales); affine: of scales and biases
  int bits = 0;                   // 0: dense or fp8; 4 or 8: MLX affine
  int group_size = 0;             // affine: the group; fp8: the scale block (128)
  int64_t rows = 0, cols = 0, expert_stride = 0;
};
// Whether the kernels take this matrix (cols a multiple of 32, affine groups of
// 32, 64 or 128, fp8 blocks of 128 whole in each expert's rows).
bool moe_matrix_supported(const ExpertMatrix& m);

struct MoeRouteArgs {
  const float* logits = nullptr;      // [T, E]
  const float* correction = nullptr;  // [E] or null
  int32_t* ids = nullptr;             // [T, k]
  float* weights = nullptr;           // [T, k]
  int64_t T = 0;
  int E = 0, k = 0, n_groups = 1, top_groups = 1;
  bool sigmoid = false, renormalize = false;
  float scale = 1.0f;
};
// One block per token (moe_routing.cuh); E at most kMaxRoutedExperts.
constexpr int kMaxRoutedExperts = 1024;
// Whether the experts' gate/up that routes its token runs the kernel in which
// each warp routes alone (moe_routing.cuh, route_slot_in_warp): no expert
// groups, and at most kWarpRoutedExperts experts, a multiple of 32; else the
// kernel whose block ranks the experts together.
constexpr int kWarpRoutedExperts = 128;
inline bool routes_in_a_warp(const MoeRouteArgs& a) {
  return a.n_groups <= 1 && a.E % 32 == 0 && a.E <= kWarpRoutedExperts;
}
cudaError_t launch_moe_route(const MoeRouteArgs& a, cudaStream_t stream);

struct MoeExpertsArgs {
  ExpertMatrix gate, up, down;   // down: rows d_model, cols d_ff
  const float* x = nullptr;      // [T, d_model]
  const int32_t* ids = nullptr;  // [T, k]
  const float* weights = nullptr;
  float* out = nullptr;          // [T, d_model]
  int64_t T = 0, k = 0, n_experts = 0, d_model = 0, d_ff = 0;
  // Lever routing_in_experts (the tensor-core experts, affine and FP8): with
  // route.logits set, the gate/up kernel routes each token itself, before its
  // wait, and writes the choice to route.ids and route.weights (which ids and
  // weights then name) for the kernels after it; no routing kernel runs.
  MoeRouteArgs route;
  // The tensor-core affine experts only: down adds into out (the residual)
  // instead of writing it.
  bool accumulate = false;
  // The tensor-core affine experts only (lever fused_norm_matvec): x is h, and
  // the prepare kernel forms x's images from RMSNorm(h) norm_w. x_final: h was
  // final when that kernel started (the kernel before it, the router, let it
  // start only after its own wait), so it forms them before its wait.
  const void* norm_w = nullptr;
  DType norm_dtype = DType::f32;
  float eps = 0;
  bool x_final = false;
};
// Whether a.route (set) describes a's own choice, for a gate/up that routes:
// the same k, T, ids and weights, and an expert count the routing takes.
inline bool routing_fits(const MoeExpertsArgs& a) {
  const MoeRouteArgs& r = a.route;
  return r.k == a.k && r.k <= 32 && r.E >= a.k && r.E <= kMaxRoutedExperts && r.T == a.T && r.ids && r.weights &&
         r.ids == a.ids && r.weights == a.weights;
}
// Matvecs over the chosen experts' rows only, two kernels, f32 arithmetic: decode
// (T <= kMaxMatvecTokens), and every T for f32 experts (test checkpoints, which
// the bf16 GEMM would round). T * k <= 65535. `act` is scratch [T * k, d_ff] f32.
cudaError_t launch_moe_experts_decode(const MoeExpertsArgs& a, float* act, cudaStream_t stream);

// The same decode on the tensor cores (lever tensor_core_moe_matvec,
// affine_matvec_mma.cu), for MLX affine experts: x converted once into exact
// integer digits (one image per token), gate/up as mma matvecs over each
// pair's expert rows into [2][T k][d_ff], the activations silu(gate) up times
// the routing weight converted likewise, and down as one matvec per token over
// the concatenation of its k experts' rows, a warp per slot, their sums added
// in slot order. Needs T <= 16 (past 8 under lever sixteen_token_experts, which
// moe_ops.cpp checks), k dividing 8, d_ff a multiple of 16 and rows of
// whole stages, and to route in gate/up (route.logits), k <= 32 and E no more
// experts than x's image has room to route in; scratch of
// moe_experts_mma_scratch_bytes (256-byte aligned).
bool moe_experts_mma_supports(const MoeExpertsArgs& a);
int64_t moe_experts_mma_scratch_bytes(const MoeExpertsArgs& a);
cudaError_t launch_moe_experts_mma(const MoeExpertsArgs& a, void* scratch, cudaStream_t stream);
// Lever deep_moe_ring: those matvecs at one token of int8 experts keep five
// stages a warp in flight instead of three. Off unless set.
void set_deep_moe_ring(bool on);
bool deep_moe_ring_enabled();
// The ring stages a warp of gate/up and of down takes for `a` (lever deep_moe_ring).
struct MoeRingStages {
  int gate_up = 0, down = 0;
};
MoeRingStages moe_experts_mma_ring_stages(const MoeExpertsArgs& a);

// The same for FP8 experts (128x128 block scales; fp8_matvec_mma.cu): x and the
// activations split into f16 hi and lo (22 bits a token and block), f32 sums.
// Needs T <= 8, k dividing 8, d_model and d_ff multiples of 128.
bool moe_experts_fp8_mma_supports(const MoeExpertsArgs& a);
int64_t moe_experts_fp8_mma_scratch_bytes(const MoeExpertsArgs& a);
cudaError_t launch_moe_experts_fp8_mma(const MoeExpertsArgs& a, void* scratch, cudaStream_t stream);

// Prefill: the (token, slot) pairs sorted by expert on the device, then two
// grouped tensor-core GEMMs (bf16 inputs, f32 accumulation) in which each
// expert's weights are read once per tile of 64 of its rows, and a combine in
// slot order. Scratch sizes from moe_prefill_scratch_bytes.
// Under lever tensor_core_affine_moe_gemm, MLX affine experts take the
// dequantizing affine GEMM grouped by expert instead (affine_launchers.h), and
// under tensor_core_dense_moe_gemm bf16 and FP8 experts take it too.
size_t moe_prefill_scratch_bytes(const MoeExpertsArgs& a);
cudaError_t launch_moe_experts_prefill(const MoeExpertsArgs& a, void* scratch, cudaStream_t stream);

// out[t, :] += y[t, :] * sigmoid(gate[t]) (gate null: out += y).
cudaError_t launch_add_gated(float* out, const float* y, const float* gate, int64_t T, int64_t d, cudaStream_t stream);

}  // namespace mere::cuda
