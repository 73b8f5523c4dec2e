// One attention head row held by a warp through Qwen3's per-head RMSNorm and
// RoPE: shared by the K/V store kernel (qk_norm_rope_store.cu) and the decode
// attention that ropes its own inputs (attention.cu, lever rope_in_attention),
// so both give the same bits.
#pragma once

#include "ops/cuda/common.cuh"

namespace mere::cuda {

// The rotation's sin and cos of pair m at position pos, scaled by the attention
// factor: the f32 product, as the rope kernel computes it.
__device__ __forceinline__ void rope_angle(const RopeParams& rope, int m, int64_t pos, float& s, float& c) {
  sincosf(rope.inv_freq[m] * float(pos), &s, &c);
  c *= rope.attention_factor;
  s *= rope.attention_factor;
}

// e holds the row's elements lane + 32 i (0 past head_dim, kPerLane * 32 >=
// head_dim); on return, the row normalised (when has_norm: weight[i] the norm
// weight of element lane + 32 i, f32 RMSNorm as rms_norm) and rotated,
// angle(m, s, c) giving rope_angle's values of pair m. staged is the warp's own
// shared row of kPerLane * 32 floats, through which a lane reads its rotation
// partner. The callers load the weights before their kernels' waits (they
// never change in a forward).
template <int kPerLane, typename Angle>
__device__ __forceinline__ void norm_and_rotate_row(float (&e)[kPerLane], bool has_norm,
                                                    const float (&weight)[kPerLane], float eps,
                                                    const RopeParams& rope, Angle angle, int head_dim, float* staged,
                                                    int lane) {
  if (has_norm) {
    float sum = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) sum += e[i] * e[i];
    const float inv = rsqrtf(warp_sum(sum) / float(head_dim) + eps);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int j = lane + 32 * i;
      if (j < head_dim) e[i] = weight[i] * (e[i] * inv);
    }
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) staged[lane + 32 * i] = e[i];
  __syncwarp();
  const int rot = 2 * rope.half;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int j = lane + 32 * i;
    if (j >= head_dim || j >= rot) continue;
    // Rotate-half pairs (j, j + half); interleaved pairs (2m, 2m + 1).
    const int m = rope.interleaved ? j / 2 : j % rope.half;
    const bool first = rope.interleaved ? (j % 2 == 0) : (j < rope.half);
    const int partner = rope.interleaved ? (first ? j + 1 : j - 1) : (first ? j + rope.half : j - rope.half);
    float s, c;
    angle(m, s, c);
    const float other = staged[partner];
    e[i] = first ? e[i] * c - other * s : e[i] * c + other * s;
  }
  __syncwarp();  // every lane has read its partner before staged is reused
}

}  // namespace mere::cuda
