// RMSNorm: one block per row; the block reduces the sum of squares in f32.
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

// With add set, h += add first (the residual) and the norm reads the new h; the
// loop order is the same either way, so the fused form is bit-identical.
template <typename W>
__global__ void rms_norm_kernel(float* x, const float* add, const W* w, float* y, int64_t d, float eps) {
  allow_next_kernel();
  wait_for_previous_kernel();
  float* xr = x + blockIdx.x * d;
  float* yr = y + blockIdx.x * d;
  float sum = 0;
  if (add) {
    const float* ar = add + blockIdx.x * d;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      float v = xr[i] + ar[i];
      xr[i] = v;
      sum += v * v;
    }
  } else {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) sum += xr[i] * xr[i];
  }
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

namespace {

cudaError_t launch(float* x, const float* add, const void* w, DType w_dtype, float* y, int64_t rows, int64_t d,
                   float eps, cudaStream_t stream) {
  int threads = d >= 1024 ? 1024 : d >= 256 ? 256 : 64;
  return visit_float(w_dtype, [&]<typename W>() {
    launch_kernel(rms_norm_kernel<W>, unsigned(rows), threads, 0, stream, x, add, static_cast<const W*>(w), y, d, eps);
  });
}

}  // namespace

cudaError_t launch_rms_norm(const float* x, const void* w, DType w_dtype, float* y, int64_t rows, int64_t d,
                            float eps, cudaStream_t stream) {
  return launch(const_cast<float*>(x), nullptr, w, w_dtype, y, rows, d, eps, stream);  // x is only read
}

cudaError_t launch_add_rms_norm(float* h, const float* x, const void* w, DType w_dtype, float* y, int64_t rows,
                                int64_t d, float eps, cudaStream_t stream) {
  return launch(h, x, w, w_dtype, y, rows, d, eps, stream);
}

}  // namespace mere::cuda
