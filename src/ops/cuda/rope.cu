// RoPE: one thread per rotated pair. The inverse frequencies travel as a kernel
// parameter, so no table lives in device memory.
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

__global__ void rope_kernel(float* x, const int32_t* positions, const int32_t* start_pos, int32_t pos0, int64_t T,
                            int64_t heads, int64_t head_dim, const __grid_constant__ RopeParams p) {
  allow_next_kernel();
  wait_for_previous_kernel();
  int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= T * heads * p.half) return;
  int i = int(idx % p.half);
  int64_t th = idx / p.half, t = th / heads;
  float pos = float(positions ? positions[t] : (start_pos ? *start_pos : pos0) + int32_t(t));
  float angle = p.inv_freq[i] * pos;  // the f32 product transformers computes
  float s, c;
  sincosf(angle, &s, &c);
  c *= p.attention_factor;
  s *= p.attention_factor;
  float* v = x + th * head_dim;
  int a = p.interleaved ? 2 * i : i, b = p.interleaved ? 2 * i + 1 : i + p.half;
  float x0 = v[a], x1 = v[b];
  v[a] = x0 * c - x1 * s;
  v[b] = x1 * c + x0 * s;
}

}  // namespace

cudaError_t launch_rope(float* x, const int32_t* positions, const int32_t* start_pos, int32_t pos0, int64_t T,
                        int64_t heads, int64_t head_dim, const RopeParams& params, cudaStream_t stream) {
  int64_t n = T * heads * params.half;
  launch_kernel(rope_kernel, ceil_div(n, 256), 256, 0, stream, x, positions, start_pos, pos0, T, heads, head_dim, params);
  return cudaGetLastError();
}

}  // namespace mere::cuda
