// Device helpers shared by the kernels: element conversion, warp reductions,
// and dispatch from a DType to the storage type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mere::cuda {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Calls fn.template operator()<T>() with T the storage type of a float dtype;
// any other dtype is cudaErrorInvalidValue.
template <typename Fn>
cudaError_t visit_float(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::f32: fn.template operator()<float>(); break;
    case DType::bf16: fn.template operator()<__nv_bfloat16>(); break;
    case DType::f16: fn.template operator()<__half>(); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

inline int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }
inline int grid_for(int64_t n) { return ceil_div(n, 256) < 1056 ? (ceil_div(n, 256) > 0 ? ceil_div(n, 256) : 1) : 1056; }

}  // namespace mere::cuda
