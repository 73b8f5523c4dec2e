// Elementwise kernels: grid-stride, one element a thread, or a few as one
// vector load and store where the prefill's large tensors move.
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float g = gate[i];
    out[i] = g / (1.0f + __expf(-g)) * up[i];
  }
}

__global__ void add_kernel(float* h, const float* x, int64_t n) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    h[i] += x[i];
}

// It lets the next kernel start only once it has ended (no allow_next_kernel):
// a decode step after it may then read the position and the cache rows before
// it ahead of its waits (ops::set_cached_rows_final).
__global__ void advance_position_kernel(int32_t* pos, int32_t by) {
  wait_for_previous_kernel();
  *pos += by;
}

// The same, and the step's tokens straight into the host's pinned ring (no copy
// engine between graph replays). Every thread reads *pos before the write.
__global__ void advance_position_and_publish_kernel(int32_t* pos, int32_t by, const int32_t* tokens, int32_t* ring,
                                                    int32_t B, int32_t slots) {
  wait_for_previous_kernel();
  const int32_t next = *pos + by;
  int32_t* row = ring + int64_t(next % slots) * B;
  for (int32_t b = threadIdx.x; b < B; b += blockDim.x) row[b] = tokens[b];
  __syncthreads();
  if (threadIdx.x == 0) *pos = next;
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t rows, int64_t cols) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += bias[i % cols];
}

template <typename Src, typename Dst>
__global__ void convert_kernel(const Src* src, Dst* dst, int64_t n) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_float<Dst>(to_float(src[i]));
}

// N values moved as one (8 to 32 bytes: vector loads and stores).
template <typename T, int N>
struct alignas(N * sizeof(T)) Values {
  T v[N];
};
template <typename T>
using Eight = Values<T, 8>;

// convert_kernel eight values a thread where n and the pointers allow: an
// element a thread moved a prefill's f32 -> bf16 activations (24 MB) at half
// the copy bandwidth.
template <typename Src, typename Dst>
__global__ void convert_eights_kernel(const Eight<Src>* src, Eight<Dst>* dst, int64_t eights) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < eights;
       i += int64_t(gridDim.x) * blockDim.x) {
    const Eight<Src> a = src[i];
    Eight<Dst> b;
#pragma unroll
    for (int j = 0; j < 8; ++j) b.v[j] = from_float<Dst>(to_float(a.v[j]));
    dst[i] = b;
  }
}

// out[t, j] = silu(gate_up[t, j]) * gate_up[t, f + j] in f32, stored as Out:
// blockIdx.x a row, kWidth columns a thread (4 as one vector load of each half
// where f allows).
template <typename Out, int kWidth>
__global__ void silu_mul_halves_kernel(const float* gate_up, Out* out, int64_t f) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int64_t t = blockIdx.x;
  const int64_t j = kWidth * (int64_t(blockIdx.y) * blockDim.x + threadIdx.x);
  if (j >= f) return;
  const auto g = *reinterpret_cast<const Values<float, kWidth>*>(gate_up + t * 2 * f + j);
  const auto u = *reinterpret_cast<const Values<float, kWidth>*>(gate_up + t * 2 * f + f + j);
  Values<Out, kWidth> y;
#pragma unroll
  for (int i = 0; i < kWidth; ++i) y.v[i] = from_float<Out>(g.v[i] / (1.0f + __expf(-g.v[i])) * u.v[i]);
  *reinterpret_cast<Values<Out, kWidth>*>(out + t * f + j) = y;
}

// Every part in one launch: blockIdx.x a row of x, kWidth columns a thread (4
// as one 16-byte copy where every part's width allows). One column a thread,
// with a 64-bit division each, took 42 us a layer for Qwen3-30B-A3B's q/k/v of
// a 2,048-token chunk.
template <int kWidth>
__global__ void split_columns_kernel(const float* x, int64_t n, const __grid_constant__ ColumnParts parts) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int64_t t = blockIdx.x;
  const int64_t c = kWidth * (int64_t(blockIdx.y) * blockDim.x + threadIdx.x);
  if (c < n) {
    int p = 0;
    while (c >= parts.end[p]) ++p;
    const int64_t begin = p ? parts.end[p - 1] : 0;
    float* dst = parts.dst[p] + t * (parts.end[p] - begin) + c - begin;
    if constexpr (kWidth == 4)
      *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(x + t * n + c);
    else
      *dst = x[t * n + c];
  }
}

template <typename D>
__global__ void store_rows_kernel(const float* src, D* dst, const int32_t* pos_dev, int64_t n, int64_t row,
                                  const __grid_constant__ KvTables tables) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const bool per_sequence = tables.rows_are_sequences;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / row;
    const int64_t r = paged_row(tables.table[per_sequence ? t : 0], int64_t(*pos_dev) + (per_sequence ? 0 : t));
    dst[r * row + i % row] = from_float<D>(src[i]);
  }
}

}  // namespace

cudaError_t launch_store_rows(const float* src, void* dst, DType dst_dtype, const int32_t* pos_dev, int64_t T,
                              int64_t row, const KvTables& tables, cudaStream_t stream) {
  return visit_float(dst_dtype, [&]<typename D>() {
    launch_kernel(store_rows_kernel<D>, grid_for(T * row), 256, 0, stream, src, static_cast<D*>(dst), pos_dev, T * row,
                  row, tables);
  });
}

cudaError_t launch_silu_mul_halves(const float* gate_up, void* out, DType out_dtype, int64_t T, int64_t f,
                                   cudaStream_t stream) {
  if (T == 0 || f == 0) return cudaSuccess;
  if (T >= (int64_t(1) << 31)) return cudaErrorInvalidValue;
  return visit_float(out_dtype, [&]<typename O>() {
    const bool wide = f % 4 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(out) % (4 * sizeof(O)) == 0;
    launch_kernel(wide ? silu_mul_halves_kernel<O, 4> : silu_mul_halves_kernel<O, 1>, row_grid(T, f, wide ? 4 : 1),
                  dim3(kRowThreads), 0, stream, gate_up, static_cast<O*>(out), f);
  });
}

cudaError_t launch_split_columns(const float* x, int64_t T, int64_t n, const ColumnParts& parts, cudaStream_t stream) {
  if (parts.count < 1 || parts.count > ColumnParts::kMax || parts.end[parts.count - 1] != n)
    return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  if (T >= (int64_t(1) << 31)) return cudaErrorInvalidValue;
  bool wide = reinterpret_cast<uintptr_t>(x) % 16 == 0 && n % 4 == 0;
  for (int p = 0; p < parts.count; ++p)
    wide = wide && parts.end[p] % 4 == 0 && reinterpret_cast<uintptr_t>(parts.dst[p]) % 16 == 0;
  const dim3 grid = row_grid(T, n, wide ? 4 : 1);
  return launch_kernel(wide ? split_columns_kernel<4> : split_columns_kernel<1>, grid, dim3(kRowThreads), 0, stream, x,
                       n, parts);
}

cudaError_t launch_silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  launch_kernel(silu_mul_kernel, grid_for(n), 256, 0, stream, gate, up, out, n);
  return cudaGetLastError();
}

cudaError_t launch_add(float* h, const float* x, int64_t n, cudaStream_t stream) {
  launch_kernel(add_kernel, grid_for(n), 256, 0, stream, h, x, n);
  return cudaGetLastError();
}

cudaError_t launch_advance_position(int32_t* pos, int32_t by, cudaStream_t stream) {
  launch_kernel(advance_position_kernel, 1, 1, 0, stream, pos, by);
  return cudaGetLastError();
}

cudaError_t launch_advance_position_and_publish(int32_t* pos, int32_t by, const int32_t* tokens, int32_t* ring,
                                                int32_t B, int32_t slots, cudaStream_t stream) {
  launch_kernel(advance_position_and_publish_kernel, 1, B < 1024 ? B : 1024, 0, stream, pos, by, tokens, ring, B, slots);
  return cudaGetLastError();
}

cudaError_t launch_add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  launch_kernel(add_bias_kernel, grid_for(rows * cols), 256, 0, stream, y, bias, rows, cols);
  return cudaGetLastError();
}

cudaError_t launch_convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                           cudaStream_t stream) {
  cudaError_t inner = cudaSuccess;
  cudaError_t outer = visit_float(src_dtype, [&]<typename S>() {
    inner = visit_float(dst_dtype, [&]<typename D>() {
      if (n % 8 == 0 && reinterpret_cast<uintptr_t>(src) % alignof(Eight<S>) == 0 &&
          reinterpret_cast<uintptr_t>(dst) % alignof(Eight<D>) == 0) {
        launch_kernel(convert_eights_kernel<S, D>, grid_for(n / 8), 256, 0, stream,
                      static_cast<const Eight<S>*>(src), static_cast<Eight<D>*>(dst), n / 8);
        return;
      }
      launch_kernel(convert_kernel<S, D>, grid_for(n), 256, 0, stream, static_cast<const S*>(src), static_cast<D*>(dst), n);
    });
  });
  return inner != cudaSuccess ? inner : outer;
}

}  // namespace mere::cuda

#include "ops/random_hash.h"

namespace mere::cuda {
namespace {

template <typename T>
__global__ void fill_random_kernel(T* dst, int64_t n, uint64_t seed, float scale, float offset) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_float<T>(offset + scale * ops::random_uniform_pm1(seed, uint64_t(i)));
}

}  // namespace

cudaError_t launch_fill_random(void* dst, DType dtype, int64_t n, uint64_t seed, float scale, float offset,
                               cudaStream_t stream) {
  return visit_float(dtype, [&]<typename T>() {
    launch_kernel(fill_random_kernel<T>, grid_for(n), 256, 0, stream, static_cast<T*>(dst), n, seed, scale, offset);
  });
}

}  // namespace mere::cuda
