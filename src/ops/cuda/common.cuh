// Device helpers shared by the kernels: element conversion, warp reductions,
// and dispatch from a DType to the storage type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <utility>

#include "core/dtype.h"
#include "ops/cuda/launchers.h"

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

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The storage row of position p of a sequence with block table `table`
// (launchers.h KvTables), or row p when it has none (a contiguous cache).
__device__ __forceinline__ int64_t paged_row(const int32_t* table, int64_t p) {
  return table ? int64_t(__ldg(table + p / kKvPageRows)) * kKvPageRows + p % kKvPageRows : p;
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

// Programmatic dependent launch (Hopper). A kernel launched with launch_kernel()
// while the lever is on may start before the previous kernel on the stream has
// finished: it must call wait_for_previous_kernel() before it reads anything the
// previous kernels wrote or writes anything they read. Work before the wait may
// only touch memory no kernel writes (weights), what a kernel two back wrote
// where the one between allows this one only after its own wait (moe.cu's
// experts), or in a decode step the position and the cache rows before it
// (attention.cu; ops::set_cached_rows_final). allow_next_kernel() lets the
// next kernel start launching; both are no-ops for a plain launch.
__device__ __forceinline__ void wait_for_previous_kernel() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_next_kernel() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

bool programmatic_launch_enabled();  // launch.cu
bool matvec_split_k_enabled();        // launch.cu

// The current device's attribute, and its SM count (queried once); launch.cu.
int device_attribute(cudaDeviceAttr attribute);
int sm_count();

// Asynchronous global -> shared copies (cp.async).
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Four 8x8 matrices of 16-bit values from shared memory: lane l gives the
// address of row l % 8 of matrix l / 8 (16 bytes); r[j] is matrix j's fragment.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
// 16 bytes, bypassing L1; zero-filled when !valid (src unread).
__device__ __forceinline__ void copy_async_16(uint32_t dst, const void* src, bool valid = true) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
// L2 policies for cp.async's cache hint. Weights stream through L2 once a token
// (gigabytes against its 50 MB): under lever streamed_weights their copies ask
// L2 to evict their lines first, so that what a step reads again (activations,
// norm weights, a short context's K/V rows) stays.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// With `hinted`, the copy carries the L2 policy `policy`; else it is copy_async_16's.
__device__ __forceinline__ void copy_async_16_hinted(uint32_t dst, const void* src, bool hinted, uint64_t policy) {
  if (hinted)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "l"(policy)
                 : "memory");
  else
    copy_async_16(dst, src);
}
// 16 bytes read once (weights): no L1 line, and with `hinted` the L2 policy `policy`.
__device__ __forceinline__ uint4 load_streaming(const void* p, bool hinted, uint64_t policy) {
  uint4 v;
  if (hinted)
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  return v;
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed copy groups are in flight.
template <int N>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), with the programmatic
// launch attribute when the lever is on.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                          Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  if (programmatic_launch_enabled()) {
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Powers of two from their bits, for the scaled integer images of x (frexpf
// and ldexpf check their ranges in software, on the path of every prepare).
// The exponent e of a positive finite x in [2^(e-1), 2^e), as frexpf gives it;
// x below 2^-126 gives -126 (the callers floor e at -100 anyway).
__device__ __forceinline__ int frexp_exponent(float x) { return ((__float_as_int(x) >> 23) & 255) - 126; }
// 2^k for k in [-126, 127].
__device__ __forceinline__ float exp2_int(int k) { return __int_as_float((k + 127) << 23); }

// The MoE prefill's grouped GEMMs (moe.cu, affine_gemm.cu): the expert whose
// token tiles hold tile `tile`, the last e with tile_offsets[e] <= tile.
__device__ __forceinline__ int expert_of_tile(const int32_t* tile_offsets, int E, int tile) {
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_offsets[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

inline int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }
inline int grid_for(int64_t n) { return ceil_div(n, 256) < 1056 ? (ceil_div(n, 256) > 0 ? ceil_div(n, 256) : 1) : 1056; }
// Row kernels (a row of n values, per_thread a thread): grid.x the rows, grid.y
// enough blocks of kRowThreads for a row, so one short row still spreads over
// several SMs. rows < 2^31.
constexpr int kRowThreads = 256;
inline dim3 row_grid(int64_t rows, int64_t n, int per_thread) {
  return dim3(unsigned(rows), unsigned(ceil_div(ceil_div(n, per_thread), kRowThreads)));
}

}  // namespace mere::cuda
