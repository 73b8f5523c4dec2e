// The affine K/V cache's write and (for prefill over a quantized cache) its
// dequantized copy.
// Write: one warp per (token, head) row; the row is staged in shared memory,
// then the warp quantizes it group by group (kv_quant.cuh).
// Copy: one thread per element, rows [0, n) to bf16.
#include "ops/cuda/common.cuh"
#include "ops/cuda/kv_quant.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

constexpr int kWarps = 4;

__global__ void __launch_bounds__(kWarps * 32)
    store_rows_affine_kernel(const float* __restrict__ x, uint8_t* __restrict__ codes, uint16_t* __restrict__ scales,
                             uint16_t* __restrict__ biases, int bits, const int32_t* __restrict__ pos_dev, int T,
                             int heads, int head_dim, const __grid_constant__ KvTables tables) {
  allow_next_kernel();
  wait_for_previous_kernel();
  __shared__ float staged[kWarps][kMaxAttentionHeadDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + warp;  // t * heads + h
  if (row >= T * heads) return;                // the whole warp
  const int t = row / heads, h = row % heads;
  const float* src = x + int64_t(row) * head_dim;
  for (int j = lane; j < head_dim; j += 32) staged[warp][j] = src[j];
  __syncwarp();
  const bool per_sequence = tables.rows_are_sequences;
  const int64_t dst = paged_row(tables.table[per_sequence ? t : 0], int64_t(*pos_dev) + (per_sequence ? 0 : t));
  quantize_row_warp(staged[warp], head_dim, bits, dst * heads + h, codes, scales, biases, lane);
}

__global__ void dequantize_rows_kernel(const uint8_t* __restrict__ codes, const uint16_t* __restrict__ scales,
                                       const uint16_t* __restrict__ biases, int bits, __nv_bfloat16* __restrict__ out,
                                       int64_t n_elements, int head_dim) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int group = head_dim < kKvQuantGroup ? head_dim : kKvQuantGroup;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_elements;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = i / group;  // groups are consecutive: (row, head, group) in order
    const int code = bits == 8 ? codes[i] : (codes[i / 2] >> ((i % 2) * 4)) & 0xf;
    out[i] = __float2bfloat16(bf16_value(scales[g]) * float(code) + bf16_value(biases[g]));
  }
}

}  // namespace

cudaError_t launch_store_rows_affine(const float* x, void* codes, void* scales, void* biases, int bits,
                                     const int32_t* pos_dev, int T, int heads, int head_dim, const KvTables& tables,
                                     cudaStream_t stream) {
  const int group = head_dim < kKvQuantGroup ? head_dim : kKvQuantGroup;
  if ((bits != 8 && bits != 4) || head_dim > kMaxAttentionHeadDim || group % 2 || head_dim % group) return cudaErrorInvalidValue;
  return launch_kernel(store_rows_affine_kernel, dim3(ceil_div(int64_t(T) * heads, kWarps)), kWarps * 32, 0, stream, x,
                       static_cast<uint8_t*>(codes), static_cast<uint16_t*>(scales), static_cast<uint16_t*>(biases),
                       bits, pos_dev, T, heads, head_dim, tables);
}

cudaError_t launch_dequantize_rows(const void* codes, const void* scales, const void* biases, int bits, void* out,
                                   int64_t rows, int heads, int head_dim, cudaStream_t stream) {
  const int64_t n = rows * heads * head_dim;
  if (n == 0) return cudaSuccess;
  return launch_kernel(dequantize_rows_kernel, dim3(grid_for(n)), 256, 0, stream, static_cast<const uint8_t*>(codes),
                       static_cast<const uint16_t*>(scales), static_cast<const uint16_t*>(biases), bits,
                       static_cast<__nv_bfloat16*>(out), n, head_dim);
}

}  // namespace mere::cuda
