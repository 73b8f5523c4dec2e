// RMSNorm: one block per row; the block reduces the sum of squares in f32.
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

template <typename W>
__global__ void rms_norm_kernel(const float* x, const W* w, float* y, int64_t d, float eps) {
  const float* xr = x + blockIdx.x * d;
  float* yr = y + blockIdx.x * d;
  float sum = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) sum += xr[i] * xr[i];
  __shared__ float partial[32];
  sum = warp_sum(sum);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
    v = warp_sum(v);
    if (threadIdx.x == 0) partial[0] = v;
  }
  __syncthreads();
  float inv = rsqrtf(partial[0] / float(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = to_float(w[i]) * (xr[i] * inv);
}

}  // namespace

cudaError_t launch_rms_norm(const float* x, const void* w, DType w_dtype, float* y, int64_t rows, int64_t d,
                            float eps, cudaStream_t stream) {
  int threads = d >= 1024 ? 1024 : d >= 256 ? 256 : 64;
  return visit_float(w_dtype, [&]<typename W>() {
    rms_norm_kernel<W><<<unsigned(rows), threads, 0, stream>>>(x, static_cast<const W*>(w), y, d, eps);
  });
}

}  // namespace mere::cuda
