// FP8 E4M3 weights with 128x128 block scales (DeepSeek-V3, Qwen3 FP8): the decode
// matvec, and the small kernels around the prefill GEMM and the embedding.
//
// Matvec: `split` warps of a block per kRows output rows, each taking a
// contiguous share of the columns (split-K: 2 or 4 where the row groups do not
// fill a wave of resident warps, lever matvec_split_k; the block adds the shares
// in a fixed order). A warp steps through its rows 128 columns (one
// scale block, 128 bytes) at a time: lane l takes the 4 weights of bytes
// [4l, 4l + 4) of each row and the matching 4 inputs of each token with one
// float4 load, so the warp's input loads are as contiguous as its weight loads
// (with 16 weights a lane, each input load would span 2 KB and keep L1 four times
// busier: half the roofline, measured). kBatch steps of weights are in flight
// before their use, the first batch loaded before the wait for the previous
// kernel (weights never change). A lane's 4 products are summed, then scaled by
// the step's block scale; the rows of a warp share their block row (kRows divides
// 128), and each input load serves all kRows rows. E4M3 -> f16 is the hardware
// cvt (exact), f16 -> f32 exact, f32 sums.
#include <cuda_fp8.h>

#include "ops/cuda/common.cuh"
#include "ops/cuda/fp8_decode.cuh"
#include "ops/cuda/fp8_launchers.h"

namespace mere::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kScaleBlock = 128;  // the fast kernel's block: one step of a warp

// Weights are read once: keep them out of L1, where the input lives.
__device__ __forceinline__ uint32_t load_streaming(const uint32_t* p) {
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// Registers capped at 64 for one or two tokens and rows (4 blocks an SM): the
// compiler would otherwise hoist every input load of a batch and halve the warps
// in flight. More tokens or rows need up to 128.
template <int T, int kRows, int kBatch, bool kPipelined>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, T <= 2 && kRows <= 2 ? 4 : 2)
    fp8_matvec_kernel(const float* __restrict__ x, const __grid_constant__ Fp8WeightView w,
                      const float* __restrict__ bias, float* __restrict__ y, int split) {
  static_assert(kScaleBlock % kRows == 0, "the rows of a warp must share their block row");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, part = warp % split;
  const int64_t row0 = (int64_t(blockIdx.x) * (kWarpsPerBlock / split) + warp / split) * kRows;
  const int64_t n_words = w.in / 4, n_steps = (w.in + kScaleBlock - 1) / kScaleBlock;
  const int64_t share = (n_steps + split - 1) / split;  // this warp's steps [j_begin, j_end)
  const int64_t j_begin = part * share, j_end = min(n_steps, j_begin + share);
  // Rows past the end re-read the last row; their sums are dropped.
  const uint32_t* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    rows[r] = reinterpret_cast<const uint32_t*>(w.values + min(row0 + r, w.out - 1) * w.in);
  const float* scales = w.scale_inv + (min(row0, w.out - 1) / kScaleBlock) * w.scale_cols;

  // Steps past the share, and words past the row's end (its last 128 columns may
  // be partial), load nothing and count as zeros.
  using Batch = uint32_t[kBatch][kRows];
  auto load_batch = [&](Batch& word, int64_t j0) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t k = (j0 + u) * 32 + lane;
      const bool valid = j0 + u < j_end && k < n_words;
#pragma unroll
      for (int r = 0; r < kRows; ++r) word[u][r] = valid ? load_streaming(rows[r] + k) : 0u;
    }
  };
  float acc[kRows][T];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0;
  auto accumulate_batch = [&](const Batch& word, int64_t j0) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t j = j0 + u, k = j * 32 + lane;
      const bool valid = j < j_end && k < n_words;
      const float s = j < j_end ? __ldg(scales + j) : 0.0f;
      float wf[kRows][4];
#pragma unroll
      for (int r = 0; r < kRows; ++r) decode_word(word[u][r], wf[r]);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const float4 xv = valid ? __ldg(reinterpret_cast<const float4*>(x + t * w.in) + k) : float4{0, 0, 0, 0};
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float p = wf[r][0] * xv.x + wf[r][1] * xv.y + wf[r][2] * xv.z + wf[r][3] * xv.w;
          acc[r][t] = fmaf(s, p, acc[r][t]);
        }
      }
    }
  };

  Batch current, next;
  load_batch(current, j_begin);
  allow_next_kernel();
  wait_for_previous_kernel();
  if constexpr (kPipelined) {  // the next batch loads while this one is summed
    for (int64_t j0 = j_begin;;) {
      if (j0 + kBatch < j_end) load_batch(next, j0 + kBatch);
      accumulate_batch(current, j0);
      if ((j0 += kBatch) >= j_end) break;
      if (j0 + kBatch < j_end) load_batch(current, j0 + kBatch);
      accumulate_batch(next, j0);
      if ((j0 += kBatch) >= j_end) break;
    }
  } else {
    for (int64_t j0 = j_begin;;) {
      accumulate_batch(current, j0);
      if ((j0 += kBatch) >= j_end) break;
      load_batch(current, j0);
    }
  }

#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = warp_sum(acc[r][t]);
  if (split > 1) {  // the rows' first warp adds the other shares, in a fixed order
    __shared__ float partial[kWarpsPerBlock][kRows][T];
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) partial[warp][r][t] = acc[r][t];
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t)
        for (int p = 1; p < split; ++p) acc[r][t] += partial[warp + p][r][t];
  }
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = row0 + r;
    if (row >= w.out) break;
#pragma unroll
    for (int t = 0; t < T; ++t) y[t * w.out + row] = bias ? acc[r][t] + bias[row] : acc[r][t];
  }
}

// Any row length, alignment and block size: one warp per row, one byte per lane
// at a time, each weight scaled before its product. Only odd shapes come here.
template <int T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    fp8_matvec_plain_kernel(const float* __restrict__ x, const __grid_constant__ Fp8WeightView w,
                            const float* __restrict__ bias, float* __restrict__ y) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= w.out) return;
  const uint8_t* wr = w.values + row * w.in;
  const float* scales = w.scale_inv + (row / w.block) * w.scale_cols;
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0;
  for (int64_t i = lane; i < w.in; i += 32) {
    const float wv = f8_to_float(wr[i]) * scales[i / w.block];
#pragma unroll
    for (int t = 0; t < T; ++t) acc[t] = fmaf(wv, x[t * w.in + i], acc[t]);
  }
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = warp_sum(acc[t]);
  if (lane != 0) return;
#pragma unroll
  for (int t = 0; t < T; ++t) y[t * w.out + row] = bias ? acc[t] + bias[row] : acc[t];
}

template <int T, int kRows, int kBatch, bool kPipelined>
cudaError_t launch_fast(const float* x, const Fp8WeightView& w, const float* bias, float* y, int split,
                        cudaStream_t stream) {
  const int64_t row_groups = (w.out + kRows - 1) / kRows;
  return launch_kernel(fp8_matvec_kernel<T, kRows, kBatch, kPipelined>,
                       dim3(ceil_div(row_groups, kWarpsPerBlock / split)), dim3(kWarpsPerBlock * 32), 0, stream, x,
                       w, bias, y, split);
}

// Lever matvec_split_k, the rule of the bf16 matvec's (matvec.cu): warps per
// row group until the grid fills one wave of resident warps, at most 4, each
// warp keeping at least a batch of steps in flight. One warp a row group left
// Qwen3-30B-A3B's o_proj (2,048 rows, 128 blocks of 8 warps) one block an SM
// and read it at 1.4 TB/s (H100: 6.0 us for 8.4 MB; docs/benchmarks.md).
int split_for(int64_t out, int64_t in, int rows, int batch) {
  static const int64_t resident_warps =
      int64_t(sm_count()) * device_attribute(cudaDevAttrMaxThreadsPerMultiProcessor) / 32;
  if (!matvec_split_k_enabled()) return 1;
  const int64_t row_groups = (out + rows - 1) / rows, steps = (in + kScaleBlock - 1) / kScaleBlock;
  int split = 1;
  while (split < 4 && row_groups * split * 2 <= resident_warps && steps / (split * 2) >= batch) split *= 2;
  return split;
}

// The tile shapes compiled for T = 1 and 8, to compare them (variant >= 0).
constexpr Fp8MatvecTile kTiles[] = {{2, 8, false, 1}, {2, 8, false, 2}, {2, 8, false, 4}, {2, 8, true, 1},
                                    {2, 8, true, 2},  {2, 8, true, 4},  {1, 16, false, 1}, {4, 4, false, 1}};

template <int T>
cudaError_t launch_matvec_for(const float* x, const Fp8WeightView& w, const float* bias, float* y, int variant,
                              cudaStream_t stream) {
  const bool fast = w.block == kScaleBlock && w.in % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(w.values) % 4 == 0;
  if (!fast)
    return launch_kernel(fp8_matvec_plain_kernel<T>, dim3(ceil_div(w.out, kWarpsPerBlock)),
                         dim3(kWarpsPerBlock * 32), 0, stream, x, w, bias, y);
  if constexpr (T == 1 || T == 8) {
    if (variant >= 0 && variant < int(sizeof(kTiles) / sizeof(kTiles[0]))) {
      const Fp8MatvecTile tile = kTiles[variant];
      if (tile.rows_per_warp == 1) return launch_fast<T, 1, 16, false>(x, w, bias, y, tile.split, stream);
      if (tile.rows_per_warp == 4) return launch_fast<T, 4, 4, false>(x, w, bias, y, tile.split, stream);
      if (tile.pipelined) return launch_fast<T, 2, 8, true>(x, w, bias, y, tile.split, stream);
      return launch_fast<T, 2, 8, false>(x, w, bias, y, tile.split, stream);
    }
  }
  // Each input load serves all rows of a warp. (H200, Llama-3-8B shapes, T = 1:
  // 2 rows x 8 steps was the best of the tiles on every shape; T = 8: 2 rows x 8
  // pipelined measured 18-28% of the roofline against 11-24% for 4 x 4, the
  // earlier default from 3 tokens; docs/benchmarks.md.)
  const int split = split_for(w.out, w.in, 2, 8);
  if constexpr (T <= 2) return launch_fast<T, 2, 8, false>(x, w, bias, y, split, stream);
  else return launch_fast<T, 2, 8, true>(x, w, bias, y, split, stream);
}

// One warp per (token, 128-column block); each lane holds 4 of its values.
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    fp8_quantize_kernel(const float* __restrict__ x, int64_t T, int64_t in, uint8_t* __restrict__ q,
                        float* __restrict__ scales, int64_t scale_ld) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int lane = threadIdx.x % 32;
  const int64_t n_blocks = (in + 127) / 128;
  const int64_t item = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (item >= T * n_blocks) return;
  const int64_t t = item / n_blocks, kb = item % n_blocks;
  float v[4], amax = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t i = kb * 128 + j * 32 + lane;
    v[j] = i < in ? x[t * in + i] : 0.0f;
    amax = fmaxf(amax, fabsf(v[j]));
  }
  for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  const float inv = amax > 0 ? 448.0f / amax : 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t i = kb * 128 + j * 32 + lane;
    if (i < in) q[t * in + i] = __nv_cvt_float_to_fp8(v[j] * inv, __NV_SATFINITE, __NV_E4M3);
  }
  if (lane == 0) scales[kb * scale_ld + t] = amax > 0 ? amax / 448.0f : 1.0f;
}

template <typename D> __device__ __forceinline__ D store_as(float v);
template <> __device__ __forceinline__ float store_as<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 store_as<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

// Grid-stride over 16-byte chunks (kVec 16: rows and blocks of 16-byte multiples,
// a 16-byte aligned destination) or single values.
template <typename D, int kVec>
__global__ void __launch_bounds__(256) fp8_dequantize_kernel(const __grid_constant__ Fp8WeightView w, D* dst) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int64_t per_row = w.in / kVec, n = w.out * per_row, scale_cols = w.scale_cols;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = k / per_row, i0 = (k - o * per_row) * kVec;
    const float* scales = w.scale_inv + (o / w.block) * scale_cols;
    D* out = dst + o * w.in + i0;
    if constexpr (kVec == 16) {
      float v[16];
      decode_chunk(__ldg(reinterpret_cast<const uint4*>(w.values + o * w.in + i0)), v);
      const float s = scales[i0 / w.block];
#pragma unroll
      for (int j = 0; j < 16; ++j) v[j] *= s;
      // 16-byte stores: one value at a time, a warp's stores touched 32 sectors
      // each and the dequantized copy ran far below the bandwidth.
      uint4* out4 = reinterpret_cast<uint4*>(out);
      if constexpr (sizeof(D) == 4) {
#pragma unroll
        for (int q = 0; q < 4; ++q)
          out4[q] = make_uint4(__float_as_uint(v[4 * q]), __float_as_uint(v[4 * q + 1]), __float_as_uint(v[4 * q + 2]),
                               __float_as_uint(v[4 * q + 3]));
      } else {
        uint32_t pairs[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const __nv_bfloat162 two = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);  // .x: the lower address
          pairs[j] = *reinterpret_cast<const uint32_t*>(&two);
        }
        out4[0] = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
        out4[1] = make_uint4(pairs[4], pairs[5], pairs[6], pairs[7]);
      }
    } else {
      out[0] = store_as<D>(f8_to_float(w.values[o * w.in + i0]) * scales[i0 / w.block]);
    }
  }
}

// One block per token: its row of values times the row's block scales.
__global__ void __launch_bounds__(256) fp8_embed_kernel(const __grid_constant__ Fp8WeightView w,
                                                        const int32_t* __restrict__ ids, float* __restrict__ out) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int64_t t = blockIdx.x, id = ids[t];
  const uint8_t* row = w.values + id * w.in;
  const float* scales = w.scale_inv + (id / w.block) * w.scale_cols;
  for (int64_t i = threadIdx.x; i < w.in; i += blockDim.x)
    out[t * w.in + i] = f8_to_float(row[i]) * scales[i / w.block];
}

}  // namespace

cudaError_t launch_fp8_matvec(const float* x, const Fp8WeightView& w, const float* bias, float* y, int64_t T,
                              cudaStream_t stream, int variant) {
  switch (T) {
    case 1: return launch_matvec_for<1>(x, w, bias, y, variant, stream);
    case 2: return launch_matvec_for<2>(x, w, bias, y, variant, stream);
    case 3: return launch_matvec_for<3>(x, w, bias, y, variant, stream);
    case 4: return launch_matvec_for<4>(x, w, bias, y, variant, stream);
    case 5: return launch_matvec_for<5>(x, w, bias, y, variant, stream);
    case 6: return launch_matvec_for<6>(x, w, bias, y, variant, stream);
    case 7: return launch_matvec_for<7>(x, w, bias, y, variant, stream);
    case 8: return launch_matvec_for<8>(x, w, bias, y, variant, stream);
    default: return cudaErrorInvalidValue;
  }
}

int fp8_matvec_variants() { return int(sizeof(kTiles) / sizeof(kTiles[0])); }
int fp8_matvec_split(const Fp8WeightView& w) { return split_for(w.out, w.in, 2, 8); }
Fp8MatvecTile fp8_matvec_tile(int variant) { return kTiles[variant]; }

cudaError_t launch_fp8_quantize_activations(const float* x, int64_t T, int64_t in, uint8_t* q, float* scales,
                                            int64_t scale_ld, cudaStream_t stream) {
  const int64_t items = T * ((in + 127) / 128);
  return launch_kernel(fp8_quantize_kernel, dim3(ceil_div(items, kWarpsPerBlock)), dim3(kWarpsPerBlock * 32), 0,
                       stream, x, T, in, q, scales, scale_ld);
}

cudaError_t launch_fp8_dequantize(const Fp8WeightView& w, void* dst, DType dst_dtype, cudaStream_t stream) {
  const bool vec = w.in % 16 == 0 && w.block % 16 == 0 && reinterpret_cast<uintptr_t>(w.values) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const dim3 grid(grid_for(w.out * (vec ? w.in / 16 : w.in))), block(256);
  switch (dst_dtype) {
    case DType::f32:
      return vec ? launch_kernel(fp8_dequantize_kernel<float, 16>, grid, block, 0, stream, w, static_cast<float*>(dst))
                 : launch_kernel(fp8_dequantize_kernel<float, 1>, grid, block, 0, stream, w, static_cast<float*>(dst));
    case DType::bf16:
      return vec ? launch_kernel(fp8_dequantize_kernel<__nv_bfloat16, 16>, grid, block, 0, stream, w,
                                 static_cast<__nv_bfloat16*>(dst))
                 : launch_kernel(fp8_dequantize_kernel<__nv_bfloat16, 1>, grid, block, 0, stream, w,
                                 static_cast<__nv_bfloat16*>(dst));
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_fp8_embed(const Fp8WeightView& w, const int32_t* ids, int64_t T, float* out, cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  return launch_kernel(fp8_embed_kernel, dim3(unsigned(T)), dim3(256), 0, stream, w, ids, out);
}

}  // namespace mere::cuda
