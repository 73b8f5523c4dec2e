// RMSNorm: one block per row; the block reduces the sum of squares in f32.
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

// With add set, h += add first (the residual) and the norm reads the new h; the
// loop order is the same either way, so the fused form is bit-identical.
// kPer > 0: each thread keeps its kPer values (indices threadIdx.x + k
// blockDim.x) in registers between the sum and the scaling, and reads its
// weights before waiting for the previous kernel (weights never change in a
// forward), so the row costs one round trip to memory after the wait instead
// of one per value; the order of every sum is unchanged, so are the bits.
// kPer == 0: any d, a loop over the row. Y: y's type, each value rounded once
// from the f32 the f32 form stores (a GEMM's input in its weight's dtype).
template <typename W, typename Y, int kPer>
__global__ void __launch_bounds__(1024)
    rms_norm_kernel(float* x, const float* add, const W* w, Y* y, int64_t d, float eps) {
  float wv[kPer > 0 ? kPer : 1];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    wv[k] = i < d ? to_float(w[i]) : 0.0f;
  }
  allow_next_kernel();
  wait_for_previous_kernel();
  float* xr = x + blockIdx.x * d;
  Y* yr = y + blockIdx.x * d;
  const float* ar = add ? add + blockIdx.x * d : nullptr;
  float sum = 0;
  float v[kPer > 0 ? kPer : 1];
  if constexpr (kPer > 0) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
      v[k] = i < d ? (ar ? xr[i] + ar[i] : xr[i]) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
      if (i >= d) continue;
      if (ar) xr[i] = v[k];
      sum += v[k] * v[k];
    }
  } else if (ar) {
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
  const float inv = rsqrtf(partial[0] / float(d) + eps);
  if constexpr (kPer > 0) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
      if (i < d) yr[i] = from_float<Y>(wv[k] * (v[k] * inv));
    }
  } else {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = from_float<Y>(to_float(w[i]) * (xr[i] * inv));
  }
}

}  // namespace

namespace {

cudaError_t launch(float* x, const float* add, const void* w, DType w_dtype, void* y, DType y_dtype, int64_t rows,
                   int64_t d, float eps, cudaStream_t stream) {
  const int threads = d >= 1024 ? 1024 : d >= 256 ? 256 : 64;
  const int64_t per_thread = (d + threads - 1) / threads;
  cudaError_t status = cudaSuccess;
  const cudaError_t dispatch = visit_float(w_dtype, [&]<typename W>() {
    status = visit_float(y_dtype, [&]<typename Y>() {
      const auto kernel = per_thread <= 4   ? rms_norm_kernel<W, Y, 4>
                          : per_thread <= 8 ? rms_norm_kernel<W, Y, 8>
                                            : rms_norm_kernel<W, Y, 0>;
      launch_kernel(kernel, unsigned(rows), threads, 0, stream, x, add, static_cast<const W*>(w), static_cast<Y*>(y),
                    d, eps);
    });
  });
  return dispatch != cudaSuccess ? dispatch : status;
}

}  // namespace

cudaError_t launch_rms_norm(const float* x, const void* w, DType w_dtype, float* y, int64_t rows, int64_t d,
                            float eps, cudaStream_t stream) {
  return launch(const_cast<float*>(x), nullptr, w, w_dtype, y, DType::f32, rows, d, eps, stream);  // x is only read
}

cudaError_t launch_rms_norm_as(const float* x, const void* w, DType w_dtype, void* y, DType y_dtype, int64_t rows,
                               int64_t d, float eps, cudaStream_t stream) {
  return launch(const_cast<float*>(x), nullptr, w, w_dtype, y, y_dtype, rows, d, eps, stream);
}

cudaError_t launch_add_rms_norm(float* h, const float* x, const void* w, DType w_dtype, float* y, int64_t rows,
                                int64_t d, float eps, cudaStream_t stream) {
  return launch(h, x, w, w_dtype, y, DType::f32, rows, d, eps, stream);
}

}  // namespace mere::cuda
