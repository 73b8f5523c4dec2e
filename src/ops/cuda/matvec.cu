// Decode matrix-vector products, y[T, out] = x[T, in] w[out, in]^T for T <= 8.
// One warp per output row: each lane streams 16-byte chunks of the weight row
// (8 bf16) with four chunks in flight, keeps T partial sums, and the warp
// reduces them. Every weight byte is read once per call.
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// acc += dot(w[0..N), x[0..N)) with x read as 16-byte float4 loads (x rows are
// 16-byte aligned: the launcher requires in * sizeof(W) % 16 == 0, so in % 4 == 0).
template <typename W, int N>
__device__ __forceinline__ void accumulate_chunk(float& acc, const W* w, const float* x) {
#pragma unroll
  for (int e = 0; e < N; e += 4) {
    float4 xv = __ldg(reinterpret_cast<const float4*>(x + e));
    acc += to_float(w[e]) * xv.x + to_float(w[e + 1]) * xv.y + to_float(w[e + 2]) * xv.z + to_float(w[e + 3]) * xv.w;
  }
}

template <typename W, int T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    matvec_kernel(const float* __restrict__ x, const W* __restrict__ w, const float* __restrict__ bias,
                  float* __restrict__ y, int64_t in, int64_t out) {
  constexpr int kPerChunk = 16 / sizeof(W);  // elements in one 16-byte load
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32;
  if (row >= out) return;
  const W* wr = w + row * in;
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0;
  const int64_t n_chunks = in / kPerChunk;
  int64_t c = lane;
  // Four chunks per lane in flight before their first use.
  for (; c + 96 < n_chunks; c += 128) {
    uint4 chunk[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) chunk[u] = __ldg(reinterpret_cast<const uint4*>(wr) + c + 32 * u);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const W* wv = reinterpret_cast<const W*>(&chunk[u]);
      const int64_t base = (c + 32 * u) * kPerChunk;
#pragma unroll
      for (int t = 0; t < T; ++t) accumulate_chunk<W, kPerChunk>(acc[t], wv, x + t * in + base);
    }
  }
  for (; c < n_chunks; c += 32) {
    uint4 chunk = __ldg(reinterpret_cast<const uint4*>(wr) + c);
    const W* wv = reinterpret_cast<const W*>(&chunk);
#pragma unroll
    for (int t = 0; t < T; ++t) accumulate_chunk<W, kPerChunk>(acc[t], wv, x + t * in + c * kPerChunk);
  }
  for (int64_t i = n_chunks * kPerChunk + lane; i < in; i += 32)  // tail when in is not a multiple of 16 bytes
#pragma unroll
    for (int t = 0; t < T; ++t) acc[t] += to_float(wr[i]) * x[t * in + i];
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float s = warp_sum(acc[t]);
    if (lane == 0) y[t * out + row] = bias ? s + bias[row] : s;
  }
}

}  // namespace

cudaError_t launch_matvec(const float* x, const void* w, DType w_dtype, const float* bias, float* y, int64_t T,
                          int64_t in, int64_t out, cudaStream_t stream) {
  dim3 grid(ceil_div(out, kWarpsPerBlock)), block(kWarpsPerBlock * 32);
  return visit_float(w_dtype, [&]<typename W>() {
    const W* wt = static_cast<const W*>(w);
    switch (T) {
      case 1: matvec_kernel<W, 1><<<grid, block, 0, stream>>>(x, wt, bias, y, in, out); break;
      case 2: matvec_kernel<W, 2><<<grid, block, 0, stream>>>(x, wt, bias, y, in, out); break;
      case 3: matvec_kernel<W, 3><<<grid, block, 0, stream>>>(x, wt, bias, y, in, out); break;
      case 4: matvec_kernel<W, 4><<<grid, block, 0, stream>>>(x, wt, bias, y, in, out); break;
      case 5: matvec_kernel<W, 5><<<grid, block, 0, stream>>>(x, wt, bias, y, in, out); break;
      case 6: matvec_kernel<W, 6><<<grid, block, 0, stream>>>(x, wt, bias, y, in, out); break;
      case 7: matvec_kernel<W, 7><<<grid, block, 0, stream>>>(x, wt, bias, y, in, out); break;
      default: matvec_kernel<W, 8><<<grid, block, 0, stream>>>(x, wt, bias, y, in, out); break;
    }
  });
}

}  // namespace mere::cuda
