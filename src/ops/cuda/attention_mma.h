// Lever tensor_core_attention: split-K decode attention over a dense bf16 or
// f16 cache on the tensor cores (attention_mma.cu), launched by attention.cu in
// place of the CUDA-core kernel past kTensorCoreAttentionFromKeys keys (or its
// splits' worth of kMinKeysPerSplit keys, where fewer), its grid within one wave.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "ops/cuda/attention_fresh.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {

// A block takes up to 8 query heads of a kv head; two blocks fit an SM (255 registers a thread).
constexpr int kTensorCoreAttentionHeads = 8;
constexpr int kTensorCoreAttentionBlocksPerSm = 2;
// Past this many keys a step takes the tensor cores, whichever CUDA-core form
// would run. From 513 keys they ran -2% to +4% by shape and cache (H200;
// docs/benchmarks.md, fortieth session), so not there.
constexpr int kTensorCoreAttentionFromKeys = 1024;

// head_dim is HD (64 or 128), KV bf16 or f16, the rows 16-byte aligned. The
// arguments are the CUDA-core GQA kernel's (attention.cu); the grid is
// (kv heads x chunks of 8 heads, T, grid_splits), one partial per split of
// n_splits, those past the grid marked empty.
template <typename KV, int HD, bool kFresh>
cudaError_t launch_attention_mma(const float* q, const KV* k, const KV* v, float* part_m, float* part_l,
                                 float* part_o, int T, int n_heads, int n_kv_heads, const int32_t* pos_dev,
                                 int64_t pos0, int n_splits, int grid_splits, float scale, const KvTables& tables,
                                 cudaStream_t stream, const FreshArgs<kFresh>& fresh, bool rows_final);

}  // namespace mere::cuda
