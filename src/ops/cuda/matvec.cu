// Decode matrix-vector products, y[T, out] = x[T, in] w[out, in]^T for T <= 8.
// One warp per output row: each lane streams 16-byte chunks of the weight row,
// kBatch loads in flight before their first use, keeps T partial sums, and the
// warp reduces them. Every weight byte is read once per call.
//
// The input may be formed on the fly (MatvecInput) and the result added to y,
// which folds RMSNorm, SwiGLU and the residual add into the matmuls of a decode
// step (lever fused_norm_matvec). The first weight loads are issued before the
// kernel waits for the previous one (programmatic launch): weights never change.
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kBatch = 4;  // 16-byte weight loads per lane in flight

// The input's elements [e, e + N) for token t, as the matmul sees them.
template <typename W, int N, MatvecInput kInput>
__device__ __forceinline__ void input_chunk(const MatvecArgs& a, int t, int64_t e, float (&v)[N]) {
  if constexpr (kInput == MatvecInput::silu_gated) {
    const float* gate = a.x + t * 2 * a.in + e;
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      float4 g = __ldg(reinterpret_cast<const float4*>(gate + i));
      float4 u = __ldg(reinterpret_cast<const float4*>(gate + a.in + i));
      v[i] = g.x / (1.0f + __expf(-g.x)) * u.x;
      v[i + 1] = g.y / (1.0f + __expf(-g.y)) * u.y;
      v[i + 2] = g.z / (1.0f + __expf(-g.z)) * u.z;
      v[i + 3] = g.w / (1.0f + __expf(-g.w)) * u.w;
    }
  } else {
    const float* x = a.x + t * a.in + e;
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      float4 xv = __ldg(reinterpret_cast<const float4*>(x + i));
      v[i] = xv.x;
      v[i + 1] = xv.y;
      v[i + 2] = xv.z;
      v[i + 3] = xv.w;
    }
    if constexpr (kInput == MatvecInput::rms_normed) {  // times the norm weight; 1/rms is applied to the sum
      const uint4 gw = __ldg(reinterpret_cast<const uint4*>(static_cast<const W*>(a.norm_w) + e));
      const W* g = reinterpret_cast<const W*>(&gw);
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] *= to_float(g[i]);
    }
  }
}

// One input element, for the tail of a row that is not a whole number of chunks.
template <typename W, MatvecInput kInput>
__device__ __forceinline__ float input_at(const MatvecArgs& a, int t, int64_t i) {
  if constexpr (kInput == MatvecInput::silu_gated) {
    float g = a.x[t * 2 * a.in + i];
    return g / (1.0f + __expf(-g)) * a.x[t * 2 * a.in + a.in + i];
  } else if constexpr (kInput == MatvecInput::rms_normed) {
    return a.x[t * a.in + i] * to_float(static_cast<const W*>(a.norm_w)[i]);
  } else {
    return a.x[t * a.in + i];
  }
}

// 1 / rms(h[t]) for every token, computed by the whole block in a fixed order,
// so every block of the grid gets the same bits.
template <int T>
__device__ void inverse_rms(const MatvecArgs& a, float (&scale)[T]) {
  __shared__ float partial[T][kWarpsPerBlock];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float4* h = reinterpret_cast<const float4*>(a.x + t * a.in);
    float sum = 0;
    for (int64_t i = threadIdx.x; i < a.in / 4; i += blockDim.x) {
      float4 v = h[i];
      sum += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    sum = warp_sum(sum);
    if (lane == 0) partial[t][warp] = sum;
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float sum = 0;
#pragma unroll
    for (int w = 0; w < kWarpsPerBlock; ++w) sum += partial[t][w];
    scale[t] = rsqrtf(sum / float(a.in) + a.eps);
  }
}

// acc[t] += the chunk of weights `wv` (elements [e, e + N)) times token t's input.
template <typename W, int T, MatvecInput kInput>
__device__ __forceinline__ void accumulate_chunk(float (&acc)[T], const uint4& chunk, const MatvecArgs& a, int64_t e) {
  constexpr int N = 16 / sizeof(W);
  const W* wv = reinterpret_cast<const W*>(&chunk);
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float xv[N];
    input_chunk<W, N, kInput>(a, t, e, xv);
#pragma unroll
    for (int i = 0; i < N; ++i) acc[t] += to_float(wv[i]) * xv[i];
  }
}

// Rows of a block; each row's dot product is shared by `split` warps (a power
// of two dividing kWarpsPerBlock), each taking a contiguous share of the chunks.
template <typename W, int T, MatvecInput kInput>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) matvec_kernel(const __grid_constant__ MatvecArgs a, int split) {
  constexpr int kPerChunk = 16 / sizeof(W);  // elements in one 16-byte load
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, part = warp % split;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock / split) + warp / split;
  const bool active = row < a.out;
  const uint4* wr = reinterpret_cast<const uint4*>(static_cast<const W*>(a.w) + (active ? row : 0) * a.in);
  const int64_t n_chunks = a.in / kPerChunk;
  // This warp's chunks [begin, end): shares rounded to whole rounds of 32 lanes.
  const int64_t share = (n_chunks + 32 * split - 1) / (32 * split) * 32;
  const int64_t begin = part * share, end = active ? min(n_chunks, begin + share) : 0;

  // kBatch chunks per lane in flight before their first use. Weights never
  // change during a forward, so the first batch loads before the wait.
  int64_t c = begin + lane;
  // Lever streamed_weights: the weights go first from L2 (and take no L1 line).
  const uint64_t evict_first = l2_evict_first();
  auto load = [&](const uint4* p) { return a.streamed_weights ? load_streaming(p, true, evict_first) : __ldg(p); };
  uint4 chunk[kBatch];
  if (c + 32 * (kBatch - 1) < end)
#pragma unroll
    for (int u = 0; u < kBatch; ++u) chunk[u] = load(wr + c + 32 * u);
  allow_next_kernel();
  wait_for_previous_kernel();

  float scale[T];
  if constexpr (kInput == MatvecInput::rms_normed) inverse_rms<T>(a, scale);

  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0;
  for (bool first = true; c + 32 * (kBatch - 1) < end; c += 32 * kBatch, first = false) {
    if (!first)
#pragma unroll
      for (int u = 0; u < kBatch; ++u) chunk[u] = load(wr + c + 32 * u);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) accumulate_chunk<W, T, kInput>(acc, chunk[u], a, (c + 32 * u) * kPerChunk);
  }
  for (; c < end; c += 32) accumulate_chunk<W, T, kInput>(acc, load(wr + c), a, c * kPerChunk);
  const W* wrow = reinterpret_cast<const W*>(wr);
  if (active && part == split - 1)  // tail: in not a multiple of 16 bytes
    for (int64_t i = n_chunks * kPerChunk + lane; i < a.in; i += 32)
#pragma unroll
      for (int t = 0; t < T; ++t) acc[t] += to_float(wrow[i]) * input_at<W, kInput>(a, t, i);
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = warp_sum(acc[t]);
  if (split > 1) {  // the row's first warp adds the others' sums, in a fixed order
    __shared__ float partial[kWarpsPerBlock][T];
    if (lane == 0)
#pragma unroll
      for (int t = 0; t < T; ++t) partial[warp][t] = acc[t];
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int t = 0; t < T; ++t)
      for (int p = 1; p < split; ++p) acc[t] += partial[warp + p][t];
  }
  if (!active || lane != 0) return;
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float s = acc[t];
    if constexpr (kInput == MatvecInput::rms_normed) s *= scale[t];
    float* out = a.y + t * a.out + row;
    const float value = a.bias ? s + a.bias[row] : s;
    *out = a.accumulate ? *out + value : value;
  }
}

// Warps per row: as many as keep the grid within one wave of resident warps
// (split-K fills the GPU when a matrix has few rows), at most 4, and never so
// many that a warp gets fewer than kMinChunksPerWarp chunks (short rows lose
// more to the block's reduction than they gain: Qwen3-0.6B ran 12% slower).
constexpr int64_t kMinChunksPerWarp = 256;
int split_for(int64_t out, int64_t n_chunks) {
  static const int64_t resident_warps =
      int64_t(sm_count()) * device_attribute(cudaDevAttrMaxThreadsPerMultiProcessor) / 32;
  if (!matvec_split_k_enabled()) return 1;
  int split = 1;
  while (split < 4 && out * split * 2 <= resident_warps && n_chunks / (split * 2) >= kMinChunksPerWarp) split *= 2;
  return split;
}

template <typename W, MatvecInput kInput>
cudaError_t launch_for(const MatvecArgs& a, cudaStream_t stream) {
  const int split = split_for(a.out, a.in * int64_t(sizeof(W)) / 16);
  const dim3 grid(ceil_div(a.out, kWarpsPerBlock / split)), block(kWarpsPerBlock * 32);
  switch (a.T) {
    case 1: return launch_kernel(matvec_kernel<W, 1, kInput>, grid, block, 0, stream, a, split);
    case 2: return launch_kernel(matvec_kernel<W, 2, kInput>, grid, block, 0, stream, a, split);
    case 3: return launch_kernel(matvec_kernel<W, 3, kInput>, grid, block, 0, stream, a, split);
    case 4: return launch_kernel(matvec_kernel<W, 4, kInput>, grid, block, 0, stream, a, split);
    case 5: return launch_kernel(matvec_kernel<W, 5, kInput>, grid, block, 0, stream, a, split);
    case 6: return launch_kernel(matvec_kernel<W, 6, kInput>, grid, block, 0, stream, a, split);
    case 7: return launch_kernel(matvec_kernel<W, 7, kInput>, grid, block, 0, stream, a, split);
    default: return launch_kernel(matvec_kernel<W, 8, kInput>, grid, block, 0, stream, a, split);
  }
}

}  // namespace

cudaError_t launch_matvec(const MatvecArgs& args, cudaStream_t stream) {
  MatvecArgs a = args;
  a.streamed_weights = streamed_weights_enabled();
  cudaError_t status = cudaSuccess;
  cudaError_t dtype_status = visit_float(a.w_dtype, [&]<typename W>() {
    switch (a.input) {
      case MatvecInput::plain: status = launch_for<W, MatvecInput::plain>(a, stream); break;
      case MatvecInput::rms_normed: status = launch_for<W, MatvecInput::rms_normed>(a, stream); break;
      case MatvecInput::silu_gated: status = launch_for<W, MatvecInput::silu_gated>(a, stream); break;
    }
  });
  return status != cudaSuccess ? status : dtype_status;
}

}  // namespace mere::cuda
