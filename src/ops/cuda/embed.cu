// Embedding gather: one block per token, threads over the row.
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

template <typename W>
__global__ void embed_kernel(const W* table, const int32_t* ids, float* out, int64_t d) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const W* row = table + int64_t(ids[blockIdx.x]) * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) out[blockIdx.x * d + i] = to_float(row[i]);
}

}  // namespace

cudaError_t launch_embed(const void* table, DType table_dtype, const int32_t* ids, int64_t T, int64_t d, float* out,
                         cudaStream_t stream) {
  return visit_float(table_dtype, [&]<typename W>() {
    launch_kernel(embed_kernel<W>, unsigned(T), 256, 0, stream, static_cast<const W*>(table), ids, out, d);
  });
}

}  // namespace mere::cuda
