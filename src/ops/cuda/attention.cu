// Causal GQA attention as split-K flash decoding, for decode and (for now) prefill.
// Grid (query head, token, split): each block walks one chunk of the visible
// keys, its four warps taking every fourth key with an online softmax; the
// warps merge in shared memory and the block writes a partial (max, sum, out).
// A second kernel merges the splits. Long contexts give many splits, so every
// SM has work even at batch 1.
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxPerLane = kMaxAttentionHeadDim / 32;
constexpr int kKeysPerSplit = 256;  // eager launches: one split per 256 visible keys

template <typename KV>
__global__ void __launch_bounds__(kWarps * 32)
    attention_split_kernel(const float* __restrict__ q, const KV* __restrict__ k, const KV* __restrict__ v,
                           float* __restrict__ part_m, float* __restrict__ part_l, float* __restrict__ part_o,
                           int n_heads, int n_kv_heads, int head_dim, const int32_t* __restrict__ pos_dev,
                           int64_t pos0, float scale, int n_splits) {
  const int h = blockIdx.x, t = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kv_h = h / (n_heads / n_kv_heads);
  // A graph replays with the position in device memory; the splits share the keys evenly.
  const int64_t n_keys = (pos_dev ? *pos_dev : pos0) + t + 1;
  const int64_t per_split = (n_keys + n_splits - 1) / n_splits;
  const int64_t begin = int64_t(split) * per_split, end = min(begin + per_split, n_keys);

  float qv[kMaxPerLane], o[kMaxPerLane];
  const float* qr = q + (int64_t(t) * n_heads + h) * head_dim;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    int j = lane + 32 * i;
    qv[i] = j < head_dim ? qr[j] * scale : 0.0f;
    o[i] = 0;
  }
  float m = -INFINITY, l = 0;
  for (int64_t s = begin + warp; s < end; s += kWarps) {
    const KV* kr = k + (s * n_kv_heads + kv_h) * head_dim;
    float dot = 0;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      int j = lane + 32 * i;
      if (j < head_dim) dot += qv[i] * to_float(kr[j]);
    }
    float score = warp_sum(dot);
    float m_new = fmaxf(m, score);
    float correction = __expf(m - m_new), p = __expf(score - m_new);
    l = l * correction + p;
    const KV* vr = v + (s * n_kv_heads + kv_h) * head_dim;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      int j = lane + 32 * i;
      if (j < head_dim) o[i] = o[i] * correction + p * to_float(vr[j]);
    }
    m = m_new;
  }

  // Merge the warps: rescale each to the block maximum.
  __shared__ float warp_m[kWarps], warp_l[kWarps];
  __shared__ float warp_o[kWarps][kMaxPerLane * 32];
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) warp_o[warp][lane + 32 * i] = o[i];
  __syncthreads();
  float block_m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) block_m = fmaxf(block_m, warp_m[w]);
  const int64_t slot = (int64_t(t) * n_heads + h) * n_splits + split;
  for (int j = threadIdx.x; j < head_dim; j += blockDim.x) {
    float acc = 0;
    for (int w = 0; w < kWarps; ++w)
      if (warp_m[w] != -INFINITY) acc += warp_o[w][j] * __expf(warp_m[w] - block_m);
    part_o[slot * head_dim + j] = acc;
  }
  if (threadIdx.x == 0) {
    float sum = 0;
    for (int w = 0; w < kWarps; ++w)
      if (warp_m[w] != -INFINITY) sum += warp_l[w] * __expf(warp_m[w] - block_m);
    part_m[slot] = block_m;
    part_l[slot] = sum;
  }
}

// One block per (token, head): merge the splits that saw any key (an empty
// split has max -inf).
__global__ void attention_merge_kernel(const float* part_m, const float* part_l, const float* part_o, float* out,
                                       int n_heads, int head_dim, int n_splits) {
  const int h = blockIdx.x, t = blockIdx.y;
  const int64_t base = (int64_t(t) * n_heads + h) * n_splits;
  float m = -INFINITY;
  for (int s = 0; s < n_splits; ++s) m = fmaxf(m, part_m[base + s]);
  float l = 0;
  for (int s = 0; s < n_splits; ++s)
    if (part_m[base + s] != -INFINITY) l += part_l[base + s] * __expf(part_m[base + s] - m);
  for (int j = threadIdx.x; j < head_dim; j += blockDim.x) {
    float acc = 0;
    for (int s = 0; s < n_splits; ++s)
      if (part_m[base + s] != -INFINITY) acc += part_o[(base + s) * head_dim + j] * __expf(part_m[base + s] - m);
    out[(int64_t(t) * n_heads + h) * head_dim + j] = acc / l;
  }
}

}  // namespace

int attention_splits(int64_t n_keys) { return ceil_div(n_keys, kKeysPerSplit); }

cudaError_t launch_attention(const float* q, const void* k, const void* v, DType kv_dtype, float* part_m,
                             float* part_l, float* part_o, float* out, int T, int n_heads, int n_kv_heads,
                             int head_dim, const int32_t* pos_dev, int64_t pos0, int n_splits, float scale,
                             cudaStream_t stream) {
  cudaError_t err = visit_float(kv_dtype, [&]<typename KV>() {
    attention_split_kernel<KV><<<dim3(n_heads, T, n_splits), kWarps * 32, 0, stream>>>(
        q, static_cast<const KV*>(k), static_cast<const KV*>(v), part_m, part_l, part_o, n_heads, n_kv_heads,
        head_dim, pos_dev, pos0, scale, n_splits);
  });
  if (err != cudaSuccess) return err;
  attention_merge_kernel<<<dim3(n_heads, T), 128, 0, stream>>>(part_m, part_l, part_o, out, n_heads, head_dim,
                                                               n_splits);
  return cudaGetLastError();
}

}  // namespace mere::cuda
