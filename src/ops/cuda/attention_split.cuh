// How split-K decode attention divides a token's visible keys among the splits,
// and how a block writes its split's partials: shared by the CUDA-core kernels
// (attention.cu) and the tensor-core ones (attention_mma.cu,
// attention_affine_mma.cu), whose partials go to the same merge.
#pragma once

#include <cstdint>

namespace mere::cuda {

// No tiny splits: a split's fixed costs (q, the partials, the merge's share)
// need some keys to pay for. 64: at 1k keys of Llama-3-8B, 16 splits of 64
// decode 5-7% faster than 4 of 256 (H200, 2026-11-30).
constexpr int kMinKeysPerSplit = 64;

struct KeyRange {
  int begin, end;  // empty when begin >= end
};

// The keys [begin, end) of `split` among the n_keys a token sees.
__device__ __forceinline__ KeyRange split_range(int n_keys, int n_splits, int split) {
  const int per_split = max(kMinKeysPerSplit, (n_keys + n_splits - 1) / n_splits);
  const int begin = int(min(int64_t(split) * per_split, int64_t(n_keys)));
  return {begin, min(begin + per_split, n_keys)};
}

// exp(m - ref) that is 0 for m = -inf even when ref is -inf too.
__device__ __forceinline__ float rescale(float m, float ref) { return m == -INFINITY ? 0.0f : __expf(m - ref); }

// A row of a tensor-core kernel's warp outputs in shared memory: rows of HD
// floats put the m16n8 fragments' columns of one quad in one bank.
template <int HD>
constexpr int kPaddedWarpORow = HD + 4;

// A block's split partials from its warps' (max, sum, out) in shared memory:
// each warp rescaled to the block maximum, rows of heads `head_ok` rejects and
// elements past head_dim skipped, slot(r) the partial's index. A row of warp_o
// may hold S >= HD floats (a kernel pads its rows so that its own stores spread
// over the banks). The warps' factors exp(m_w - max) are taken once a head, not
// once an element: with them in every element's chain this step cost about a
// fifth of a tensor-core block's samples at 4k keys (ncu, H200, thirty-ninth
// session). Every thread of the block calls it after a __syncthreads.
template <int HD, int kWarps, int HB, int S, typename HeadOk, typename Slot>
__device__ __forceinline__ void write_block_partials(const float (&warp_m)[kWarps][HB],
                                                     const float (&warp_l)[kWarps][HB],
                                                     const float (&warp_o)[kWarps][HB][S], int head_dim,
                                                     HeadOk head_ok, Slot slot, float* part_m, float* part_l,
                                                     float* part_o) {
  static_assert(HD % 4 == 0 && S % 4 == 0 && S >= HD, "rows of whole float4s");
  __shared__ float factor[kWarps][HB];  // 0 for a warp that saw no key
  if (threadIdx.x < HB) {
    const int r = threadIdx.x;
    float block_m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) block_m = fmaxf(block_m, warp_m[w][r]);
    float sum = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const bool keys = warp_m[w][r] != -INFINITY;
      const float a = keys ? __expf(warp_m[w][r] - block_m) : 0.0f;
      factor[w][r] = a;
      if (keys) sum += warp_l[w][r] * a;
    }
    if (head_ok(r)) {
      part_m[slot(r)] = block_m;
      part_l[slot(r)] = sum;
    }
  }
  __syncthreads();
  // Four elements a thread (head_dim is a multiple of 4: 16-byte K/V rows).
  for (int i = threadIdx.x; i < HB * HD / 4; i += blockDim.x) {
    const int r = i / (HD / 4), d = 4 * (i % (HD / 4));
    if (!head_ok(r) || d >= head_dim) continue;
    float4 out = {0, 0, 0, 0};
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (warp_m[w][r] == -INFINITY) continue;
      const float a = factor[w][r];
      const float4 x = *reinterpret_cast<const float4*>(&warp_o[w][r][d]);
      out.x += x.x * a, out.y += x.y * a, out.z += x.z * a, out.w += x.w * a;
    }
    *reinterpret_cast<float4*>(&part_o[slot(r) * head_dim + d]) = out;
  }
}

// The tensor-core matvecs' prepare kernels merge attention's split partials
// into o_proj's input (affine_matvec_mma.cu, fp8_matvec_mma.cu) with
// attention_merge_kernel's formula, its sums in another order: warp w of a
// block holds splits w, w + W, ... (kSplitsPerMergeWarp of them, -inf maxima
// for empty ones) of its lane's N columns. Each warp merges its own, then the
// warps meet in warp order through shared memory; warp 0 gets the merged
// columns, divided by their sum, in v (false for the other warps).
constexpr int kSplitsPerMergeWarp = 8;
template <int N, int kMaxWarps>
__device__ __forceinline__ bool merge_split_partials(const float (&ms)[kSplitsPerMergeWarp],
                                                     const float (&ls)[kSplitsPerMergeWarp],
                                                     const float (&os)[kSplitsPerMergeWarp][N], float (&v)[N]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < kSplitsPerMergeWarp; ++k) m = fmaxf(m, ms[k]);
  float l = 0, acc[N] = {};
#pragma unroll
  for (int k = 0; k < kSplitsPerMergeWarp; ++k) {
    if (ms[k] == -INFINITY) continue;  // an empty split (its outputs unwritten), or none
    const float w = __expf(ms[k] - m);
    l += ls[k] * w;
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] += os[k][j] * w;
  }
  __shared__ float shared[kMaxWarps][2 + N][32];  // per warp: max, sum, N outputs; lanes innermost
  shared[warp][0][lane] = m;
  shared[warp][1][lane] = l;
#pragma unroll
  for (int j = 0; j < N; ++j) shared[warp][2 + j][lane] = acc[j];
  __syncthreads();
  if (warp != 0) return false;
  float top = -INFINITY;
  for (int w = 0; w < warps; ++w) top = fmaxf(top, shared[w][0][lane]);
  float sum = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] = 0;
  for (int w = 0; w < warps; ++w) {
    const float mw = shared[w][0][lane];
    if (mw == -INFINITY) continue;
    const float scale = __expf(mw - top);
    sum += shared[w][1][lane] * scale;
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] += shared[w][2 + j][lane] * scale;
  }
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] /= sum;
  return true;
}

}  // namespace mere::cuda
