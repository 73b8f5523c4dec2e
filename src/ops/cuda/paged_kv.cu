// A paged cache's visible rows made contiguous (ops::gather_pages), for the
// kernels that read K/V as one array (prefill's tensor-core attention). One
// thread per unit of a row (16, 4 or 1 bytes, the widest the rows allow),
// grid-stride; each thread looks up its row's block in the table.
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

template <typename U>
__global__ void gather_pages_kernel(const U* __restrict__ storage, U* __restrict__ dst, int64_t row_units,
                                    const int32_t* __restrict__ table, int64_t n_units) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_units; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i / row_units;
    dst[i] = storage[paged_row(table, p) * row_units + i % row_units];
  }
}

}  // namespace

cudaError_t launch_gather_pages(const void* storage, void* dst, int64_t row_bytes, const int32_t* table, int64_t n,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const auto aligned = [&](uintptr_t unit) {
    return row_bytes % int64_t(unit) == 0 && reinterpret_cast<uintptr_t>(storage) % unit == 0 &&
           reinterpret_cast<uintptr_t>(dst) % unit == 0;
  };
  auto go = [&]<typename U>() {
    const int64_t row_units = row_bytes / int64_t(sizeof(U));
    return launch_kernel(gather_pages_kernel<U>, dim3(grid_for(n * row_units)), 256, 0, stream,
                         static_cast<const U*>(storage), static_cast<U*>(dst), row_units, table, n * row_units);
  };
  if (aligned(16)) return go.template operator()<uint4>();
  if (aligned(4)) return go.template operator()<uint32_t>();
  return go.template operator()<uint8_t>();
}

}  // namespace mere::cuda
