// How split-K decode attention divides a token's visible keys among the splits,
// shared by the CUDA-core kernels (attention.cu) and the tensor-core affine
// kernel (attention_affine_mma.cu), which both write partials for the same merge.
#pragma once

#include <cstdint>

namespace mere::cuda {

constexpr int kMinKeysPerSplit = 256;  // no tiny splits: prefill and short contexts use few

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

}  // namespace mere::cuda
