// Mixture of experts on CUDA: routing (one warp per token), decode matvecs over
// the chosen experts' rows only, and prefill as grouped tensor-core GEMMs over
// the (token, slot) pairs sorted by expert on the device (MLX affine experts on
// affine_gemm.cu's kernel, lever tensor_core_affine_moe_gemm, bf16 and FP8 ones
// too under tensor_core_dense_moe_gemm; the others on a WMMA kernel here). No
// host round trip:
// every step reads the expert ids from device memory, so a CUDA graph can
// capture a whole MoE layer.
#include <mma.h>

#include <optional>

#include "ops/cuda/affine_launchers.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/fp8_decode.cuh"
#include "ops/cuda/launchers.h"
#include "ops/cuda/moe_launchers.h"
#include "ops/cuda/moe_routing.cuh"

namespace mere::cuda {
namespace {

// ---- routing ----

__global__ void __launch_bounds__(kRouteThreads) moe_route_kernel(const MoeRouteArgs a) {
  __shared__ __align__(16) uint8_t scratch[routing_scratch_bytes(kMaxRoutedExperts)];
  allow_next_kernel();
  wait_for_previous_kernel();
  const int64_t t = blockIdx.x;
  const RoutingScratch s(scratch, a.E);
  rank_experts(a, t, s);
  if (threadIdx.x < a.k) {
    a.ids[t * a.k + threadIdx.x] = s.chosen[threadIdx.x];
    a.weights[t * a.k + threadIdx.x] = chosen_weight(a, s, threadIdx.x);
  }
}

// ---- weight formats ----
// Decode reads a row in 16-byte chunks (8 bf16, 16 int8 or 32 int4 values; a
// chunk never straddles an affine group), lane l taking chunks l, l + 32, ...,
// with kBatch chunks of every row it works on loaded before any is used. The
// input is staged in shared memory as float4s, XOR-swizzled within 128 bytes
// so the lanes' reads of their chunk's values are free of bank conflicts, with
// the sum of each chunk's inputs: affine rows need it, since
// sum_i w_i x_i = scale sum_i q_i x_i + bias sum_i x_i.

constexpr uint32_t kMagic = 0x4B000000u;  // the bits of 2^23: 2^23 + q once q fills the low mantissa byte
constexpr float kTwo23 = 8388608.0f;

// Byte k of v as a float (k a constant once loops unroll).
__device__ __forceinline__ float byte_as_float(uint32_t v, int k) {
  return __uint_as_float(__byte_perm(v, kMagic, 0x7440 + k)) - kTwo23;
}

// Where float4 f of a staged row lives.
__device__ __forceinline__ int swizzle(int f) { return f ^ ((f >> 3) & 7); }

__device__ __forceinline__ float dot4(float a, float b, float c, float d, const float4& x) {
  return a * x.x + b * x.y + c * x.z + d * x.w;
}

template <typename W>
struct Dense {
  static constexpr int kValues = 16 / sizeof(W);  // per chunk
  struct Meta {};
  struct Row {  // where one row's chunks are
    const uint4* chunks;
  };
  __device__ static Row row_at(const ExpertMatrix& m, int64_t row) {
    return {reinterpret_cast<const uint4*>(static_cast<const W*>(m.w) + row * m.cols)};
  }
  __device__ static uint4 load(const Row& r, int c) { return __ldg(r.chunks + c); }
  __device__ static Meta meta(const Row&, int) { return {}; }
  // Chunk c of a row (its bits in `chunk`) dotted with the staged input.
  __device__ static float dot(const uint4& chunk, Meta, const float4* xs, const float*, int c) {
    const W* w = reinterpret_cast<const W*>(&chunk);
    float s = 0;
#pragma unroll
    for (int m = 0; m < kValues / 4; ++m)
      s += dot4(to_float(w[4 * m]), to_float(w[4 * m + 1]), to_float(w[4 * m + 2]), to_float(w[4 * m + 3]),
                xs[swizzle(c * (kValues / 4) + m)]);
    return s;
  }
  // Values [k0, k0 + 16) of `row` (k0 a multiple of 16), for the prefill GEMM.
  __device__ static void load16(const ExpertMatrix& m, int64_t row, int64_t k0, float (&v)[16]) {
    const W* p = static_cast<const W*>(m.w) + row * m.cols + k0;
#pragma unroll
    for (int i = 0; i < 16; i += kValues) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(p + i));
      const W* w = reinterpret_cast<const W*>(&u);
#pragma unroll
      for (int j = 0; j < kValues; ++j) v[i + j] = to_float(w[j]);
    }
  }
};

// MLX affine: w = scale * q + bias per group of 32, 64 or 128 values; q packed
// 32 / bits to a u32, the first in the lowest bits.
template <typename S, int kBits>
struct Affine {
  static constexpr int kValues = 128 / kBits;  // per chunk
  static constexpr int kValuesShift = kBits == 4 ? 5 : 4;  // log2(kValues)
  static constexpr int kPerWord = 32 / kBits;
  struct Meta {  // as stored: converted where used, so a batch holds fewer registers
    S scale, bias;
  };
  struct Row {  // where one row's chunks, scales and biases are
    const uint4* chunks;
    const S* scales;
    const S* biases;
    int chunk_shift;  // chunk c is in group c >> chunk_shift
  };
  __device__ static const uint32_t* row_words(const ExpertMatrix& m, int64_t row) {
    return static_cast<const uint32_t*>(m.w) + row * (m.cols / kPerWord);
  }
  // Group sizes are powers of two (32, 64, 128): shifts, not divisions, which
  // cost more instructions than a chunk's arithmetic.
  __device__ static int group_shift(const ExpertMatrix& m) { return __ffs(m.group_size) - 1; }
  __device__ static Row row_at(const ExpertMatrix& m, int64_t row) {
    const int shift = group_shift(m);
    const int64_t groups = m.cols >> shift;
    return {reinterpret_cast<const uint4*>(row_words(m, row)), static_cast<const S*>(m.scales) + row * groups,
            static_cast<const S*>(m.biases) + row * groups, shift - kValuesShift};
  }
  __device__ static uint4 load(const Row& r, int c) { return __ldg(r.chunks + c); }
  __device__ static Meta meta(const Row& r, int c) {
    const int g = c >> r.chunk_shift;
    return {r.scales[g], r.biases[g]};
  }
  __device__ static Meta meta_at(const ExpertMatrix& m, int64_t row, int64_t col) {
    const int shift = group_shift(m);
    const int64_t g = row * (m.cols >> shift) + (col >> shift);
    return {static_cast<const S*>(m.scales)[g], static_cast<const S*>(m.biases)[g]};
  }
  // Chunk c of a row (its bits in `chunk`) dotted with the staged input. (One
  // FMA on 2^23 + q for scale * q, as affine_matvec.cu, measured slower here.)
  __device__ static float dot(const uint4& chunk, Meta meta, const float4* xs, const float* sums, int c) {
    const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
    float qx = 0;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      if constexpr (kBits == 8) {
        qx += dot4(byte_as_float(words[w], 0), byte_as_float(words[w], 1), byte_as_float(words[w], 2),
                   byte_as_float(words[w], 3), xs[swizzle(c * 4 + w)]);
      } else {  // nibble 2k of a word sits in byte k of lo, nibble 2k + 1 in byte k of hi
        const uint32_t lo = words[w] & 0x0F0F0F0Fu, hi = (words[w] >> 4) & 0x0F0F0F0Fu;
        qx += dot4(byte_as_float(lo, 0), byte_as_float(hi, 0), byte_as_float(lo, 1), byte_as_float(hi, 1),
                   xs[swizzle(c * 8 + 2 * w)]);
        qx += dot4(byte_as_float(lo, 2), byte_as_float(hi, 2), byte_as_float(lo, 3), byte_as_float(hi, 3),
                   xs[swizzle(c * 8 + 2 * w + 1)]);
      }
    }
    return to_float(meta.scale) * qx + to_float(meta.bias) * sums[c];
  }
  // The 8 codes [8i, 8i + 8) as floats.
  __device__ static void codes8(const ExpertMatrix& m, int64_t row, int64_t i, float (&q)[8]) {
    if constexpr (kBits == 8) {
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(row_words(m, row)) + i);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        q[k] = byte_as_float(u.x, k);
        q[4 + k] = byte_as_float(u.y, k);
      }
    } else {
      const uint32_t word = __ldg(row_words(m, row) + i), lo = word & 0x0F0F0F0Fu, hi = (word >> 4) & 0x0F0F0F0Fu;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        q[2 * k] = byte_as_float(lo, k);
        q[2 * k + 1] = byte_as_float(hi, k);
      }
    }
  }
  __device__ static void load16(const ExpertMatrix& m, int64_t row, int64_t k0, float (&v)[16]) {
    const Meta g = meta_at(m, row, k0);
    float q[8];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      codes8(m, row, k0 / 8 + h, q);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[8 * h + j] = to_float(g.scale) * q[j] + to_float(g.bias);
    }
  }
};

// FP8 E4M3 with one f32 scale per 128x128 block (the checkpoint's
// weight_scale_inv): w = value * scale. A chunk holds 16 values of one block;
// the stack's block rows are the experts' (moe_matrix_supported: whole blocks).
struct Fp8 {
  static constexpr int kValues = 16, kBlock = 128;
  struct Meta {
    float scale;
  };
  struct Row {  // where one row's chunks and its block row of scales are
    const uint4* chunks;
    const float* scales;
  };
  __device__ static Row row_at(const ExpertMatrix& m, int64_t row) {
    const int64_t blocks = (m.cols + kBlock - 1) / kBlock;
    return {reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(m.w) + row * m.cols),
            static_cast<const float*>(m.scales) + row / kBlock * blocks};
  }
  __device__ static uint4 load(const Row& r, int c) { return __ldg(r.chunks + c); }
  __device__ static Meta meta(const Row& r, int c) { return {r.scales[c / (kBlock / kValues)]}; }
  // Chunk c of a row (its bits in `chunk`) dotted with the staged input.
  __device__ static float dot(const uint4& chunk, Meta meta, const float4* xs, const float*, int c) {
    float w[kValues];
    decode_chunk(chunk, w);
    float s = 0;
#pragma unroll
    for (int m = 0; m < kValues / 4; ++m) s += dot4(w[4 * m], w[4 * m + 1], w[4 * m + 2], w[4 * m + 3], xs[swizzle(c * 4 + m)]);
    return meta.scale * s;
  }
  // Values [k0, k0 + 16) of `row` (k0 a multiple of 16), for the prefill GEMM.
  __device__ static void load16(const ExpertMatrix& m, int64_t row, int64_t k0, float (&v)[16]) {
    const Row r = row_at(m, row);
    decode_chunk(load(r, int(k0 / kValues)), v);
    const float scale = r.scales[k0 / kBlock];
#pragma unroll
    for (int j = 0; j < kValues; ++j) v[j] *= scale;
  }
};

// Calls fn.template operator()<Format>() for the matrix's storage.
template <typename Fn>
cudaError_t visit_format(const ExpertMatrix& m, Fn&& fn) {
  if (m.dtype == DType::f8_e4m3) {
    fn.template operator()<Fp8>();
    return cudaSuccess;
  }
  if (m.bits == 0) return visit_float(m.dtype, [&]<typename W>() { fn.template operator()<Dense<W>>(); });
  return visit_float(m.dtype, [&]<typename S>() {
    if (m.bits == 4) fn.template operator()<Affine<S, 4>>();
    else fn.template operator()<Affine<S, 8>>();
  });
}

// ---- decode: matvecs over the chosen experts' rows ----

constexpr int kWarps = 8;

// src [n] staged as swizzled float4s in xs, the sum of each chunk of kValues in sums.
template <int kValues>
__device__ void stage_input(const float* src, int n, float4* xs, float* sums) {
  for (int f = threadIdx.x; f < n / 4; f += blockDim.x) xs[swizzle(f)] = reinterpret_cast<const float4*>(src)[f];
  __syncthreads();
  for (int c = threadIdx.x; c < n / kValues; c += blockDim.x) {
    float sum = 0;
#pragma unroll
    for (int m = 0; m < kValues / 4; ++m) {
      const float4 v = xs[swizzle(c * (kValues / 4) + m)];
      sum += (v.x + v.y) + (v.z + v.w);
    }
    sums[c] = sum;
  }
  __syncthreads();
}

template <typename F>
size_t staged_bytes(int64_t n) {
  return size_t(n) * sizeof(float) + size_t(n / F::kValues) * sizeof(float);
}

// act[pair, r] = silu(gate_e[r] . x_t) * (up_e[r] . x_t), one warp per row r,
// `rows_per_warp` consecutive rows each (so a block stages x_t once for more
// weights, and a grid of many tokens needs fewer waves of blocks). The first
// kBatch chunks of both rows are loaded before x_t is staged, so the staging's
// latency hides behind the weights'; the next row's before this row's sums
// are reduced. (Two rows a warp at once, sharing x's reads, need more
// registers than three blocks an SM leave: spills, slower.)
template <typename F, int kBatch>
__global__ void __launch_bounds__(kWarps * 32, 3)
    moe_gate_up_decode(const MoeExpertsArgs a, float* act, int rows_per_warp) {
  extern __shared__ __align__(16) float4 staged[];  // x_t [d_model / 4], then chunk sums
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t pair = blockIdx.y;
  int64_t r = (int64_t(blockIdx.x) * kWarps + warp) * rows_per_warp;
  const int64_t last_row = min(r + rows_per_warp, a.d_ff) - 1;
  wait_for_previous_kernel();
  // After the wait: the down kernel reads the routing's ids before its own wait.
  allow_next_kernel();
  const int64_t e = a.ids[pair], t = pair / a.k;
  const int n = int(a.d_model / F::kValues);
  typename F::Row gate, up;
  uint4 wg[kBatch], wu[kBatch];
  typename F::Meta mg[kBatch], mu[kBatch];
  auto load_batch = [&](int c0) {
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int c = c0 + 32 * b;
      if (c >= n) continue;
      wg[b] = F::load(gate, c);
      wu[b] = F::load(up, c);
      mg[b] = F::meta(gate, c);
      mu[b] = F::meta(up, c);
    }
  };
  auto start_row = [&] {
    gate = F::row_at(a.gate, e * a.gate.expert_stride + r);
    up = F::row_at(a.up, e * a.up.expert_stride + r);
    load_batch(lane);
  };
  if (r <= last_row) start_row();
  float* sums = reinterpret_cast<float*>(staged + a.d_model / 4);
  stage_input<F::kValues>(a.x + t * a.d_model, int(a.d_model), staged, sums);
  for (; r <= last_row;) {
    float g = 0, u = 0;
    for (int c0 = lane; c0 < n; c0 += 32 * kBatch) {
      if (c0 != lane) load_batch(c0);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int c = c0 + 32 * b;
        if (c >= n) continue;
        g += F::dot(wg[b], mg[b], staged, sums, c);
        u += F::dot(wu[b], mu[b], staged, sums, c);
      }
    }
    const int64_t done = r++;
    if (r <= last_row) start_row();
    g = warp_sum(g);
    u = warp_sum(u);
    if (lane == 0) act[pair * a.d_ff + done] = g / (1.0f + __expf(-g)) * u;
  }
}

// out[t, j] = sum_s weight[t, s] * (down_e[j] . act[t, s]), one warp per output j,
// token t's k activation rows staged in shared memory; the chunks of all k rows
// form one loop, so the next expert's loads are in flight with this one's. The
// experts are known before the gate/up kernel ends (it lets this one start only
// after its own wait for the routing): the first batch is requested before the
// wait for the activations.
template <typename F, int kBatch>
__global__ void __launch_bounds__(kWarps * 32, 3) moe_down_decode(const MoeExpertsArgs a, const float* act) {
  extern __shared__ __align__(16) float4 staged[];  // act[t, 0..k) [k * d_ff / 4], then chunk sums
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t t = blockIdx.y, j = int64_t(blockIdx.x) * kWarps + warp;
  const int n = int(a.k * a.d_ff), per_row = int(a.d_ff / F::kValues), total = int(a.k) * per_row;
  // Chunk q of the concatenation is chunk q - s per_row of slot s = q / per_row,
  // found in f32: exact, since (q + 0.5) / per_row stays further from an integer
  // than f32 rounds for q < 2^20, and shared memory holds far fewer chunks.
  const float inv_per_row = 1.0f / float(per_row);
  const bool active = j < a.d_model;
  __shared__ int64_t slot_row[32];  // slot s: the first storage row of its expert
  __shared__ float slot_weight[32];
  if (threadIdx.x < a.k) {
    slot_row[threadIdx.x] = a.ids[t * a.k + threadIdx.x] * a.down.expert_stride;
    slot_weight[threadIdx.x] = a.weights[t * a.k + threadIdx.x];
  }
  __syncthreads();
  uint4 w[kBatch];
  typename F::Meta m[kBatch];
  int slot[kBatch];
  auto load_batch = [&](int q0) {
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int q = q0 + 32 * b;
      if (!active || q >= total) continue;
      slot[b] = __float2int_rz((float(q) + 0.5f) * inv_per_row);
      const int c = q - slot[b] * per_row;  // the chunk within its slot's row
      const typename F::Row row = F::row_at(a.down, slot_row[slot[b]] + j);
      w[b] = F::load(row, c);
      m[b] = F::meta(row, c);
    }
  };
  load_batch(lane);
  wait_for_previous_kernel();
  allow_next_kernel();
  float* sums = reinterpret_cast<float*>(staged + n / 4);
  stage_input<F::kValues>(act + t * n, n, staged, sums);  // (synchronises the block)
  if (!active) return;
  float acc = 0;
  for (int q0 = lane; q0 < total; q0 += 32 * kBatch) {
    if (q0 != lane) load_batch(q0);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int q = q0 + 32 * b;
      if (q >= total) continue;
      // Chunk q of the staged rows is chunk q of the slot-major concatenation: the same index.
      acc += slot_weight[slot[b]] * F::dot(w[b], m[b], staged, sums, q);
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) a.out[t * a.d_model + j] = acc;
}

// Calls fn.template operator()<kBatch>() with the batch that covers `chunks_per_lane`
// (1, 2, 4 or 8: the first batch holds a whole row when it fits), at most `max_batch`
// (registers: three blocks of 256 threads must fit an SM).
template <typename Fn>
void with_batch(int64_t chunks_per_lane, int max_batch, Fn&& fn) {
  if (chunks_per_lane <= 1) fn.template operator()<1>();
  else if (chunks_per_lane <= 2 || max_batch == 2) fn.template operator()<2>();
  else if (chunks_per_lane <= 4 || max_batch == 4) fn.template operator()<4>();
  else fn.template operator()<8>();
}

// Rows a gate/up warp takes: the fewest whose grid fits one wave of blocks
// (three an SM), so every block's loads start at once and x_t is staged once
// per block for as many rows as that allows.
int gate_up_rows_per_warp(const MoeExpertsArgs& a) {
  const int64_t wave = 3 * int64_t(sm_count());
  int rows = 1;
  while (rows < 64 && ceil_div(a.d_ff, int64_t(kWarps) * rows) * a.T * a.k > wave) rows *= 2;
  return rows;
}

// ---- prefill: sort the pairs by expert, grouped GEMMs, combine ----

constexpr int kTileM = 64, kTileN = 64, kTileK = 32, kPad = 8;

__global__ void moe_count_kernel(const int32_t* ids, int64_t P, int32_t* counts) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < P; p += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(&counts[ids[p]], 1);
}

// offsets: each expert's first sorted row; tile_offsets: its first GEMM row
// tile of `tile` rows.
__global__ void moe_scan_kernel(const int32_t* counts, int E, int tile, int32_t* offsets, int32_t* tile_offsets,
                                int32_t* cursor) {
  allow_next_kernel();
  wait_for_previous_kernel();
  if (threadIdx.x != 0) return;
  int32_t rows = 0, tiles = 0;
  for (int e = 0; e < E; ++e) {
    offsets[e] = cursor[e] = rows;
    tile_offsets[e] = tiles;
    rows += counts[e];
    tiles += (counts[e] + tile - 1) / tile;
  }
  offsets[E] = rows;
  tile_offsets[E] = tiles;
}

__global__ void moe_scatter_kernel(const int32_t* ids, int64_t P, int32_t* cursor, int32_t* sorted_pair,
                                   int32_t* pair_pos) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < P; p += int64_t(gridDim.x) * blockDim.x) {
    const int32_t pos = atomicAdd(&cursor[ids[p]], 1);
    sorted_pair[pos] = int32_t(p);
    pair_pos[p] = pos;
  }
}

struct GemmArgs {
  ExpertMatrix b, b_up;  // per expert [N, K]; b_up only for the gate/up GEMM
  const float* a = nullptr;
  bool a_by_token = false;  // A's sorted row r is a[token(r)] (x), else a[r] (act)
  const int32_t* sorted_pair = nullptr;
  const int32_t* offsets = nullptr;
  const int32_t* tile_offsets = nullptr;
  float* out = nullptr;  // [P, N], sorted rows
  int64_t k_slots = 0, K = 0, N = 0;
  int E = 0;
};

// One 64x64 tile of out = A_e B_e^T for the expert owning row tile blockIdx.y:
// bf16 operands staged in shared memory (weights dequantized on the way),
// f32 accumulation on the tensor cores; with kGateUp, silu(A gate^T) * (A up^T).
template <typename F, bool kGateUp>
__global__ void __launch_bounds__(128) moe_grouped_gemm(const GemmArgs g) {
  using namespace nvcuda;
  __shared__ __align__(32) __nv_bfloat16 As[kTileM][kTileK + kPad];
  __shared__ __align__(32) __nv_bfloat16 Bs[kTileN][kTileK + kPad];
  __shared__ __align__(32) __nv_bfloat16 Bu[kGateUp ? kTileN : 1][kTileK + kPad];
  __shared__ __align__(32) float scratch[4][2][16 * 16];
  allow_next_kernel();
  wait_for_previous_kernel();
  const int tile = blockIdx.y;
  if (tile >= g.tile_offsets[g.E]) return;
  const int e = expert_of_tile(g.tile_offsets, g.E, tile);
  const int64_t row0 = g.offsets[e] + int64_t(tile - g.tile_offsets[e]) * kTileM;
  const int rows = int(min(int64_t(kTileM), int64_t(g.offsets[e + 1]) - row0));
  const int64_t col0 = int64_t(blockIdx.x) * kTileN;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wm = warp / 2, wn = warp % 2;

  // Each thread stages 16 values of one A row and of one B row per K step.
  const int sr = tid / 2, sk = (tid % 2) * 16;
  const float* a_row = nullptr;
  if (sr < rows) {
    const int64_t r = row0 + sr;
    a_row = g.a + (g.a_by_token ? int64_t(g.sorted_pair[r]) / g.k_slots : r) * g.K;
  }
  const int64_t n = col0 + sr;
  const bool n_ok = n < g.N;
  const int64_t b_row = e * g.b.expert_stride + n, u_row = e * g.b_up.expert_stride + n;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2], acc_up[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::fill_fragment(acc[i][j], 0.0f);
      if constexpr (kGateUp) wmma::fill_fragment(acc_up[i][j], 0.0f);
    }
  for (int64_t k0 = 0; k0 < g.K; k0 += kTileK) {
#pragma unroll
    for (int i = 0; i < 16; i += 4) {
      const float4 v = a_row ? *reinterpret_cast<const float4*>(a_row + k0 + sk + i) : make_float4(0, 0, 0, 0);
      As[sr][sk + i] = __float2bfloat16(v.x);
      As[sr][sk + i + 1] = __float2bfloat16(v.y);
      As[sr][sk + i + 2] = __float2bfloat16(v.z);
      As[sr][sk + i + 3] = __float2bfloat16(v.w);
    }
    float v[16];
    if (n_ok) F::load16(g.b, b_row, k0 + sk, v);
#pragma unroll
    for (int i = 0; i < 16; ++i) Bs[sr][sk + i] = __float2bfloat16(n_ok ? v[i] : 0.0f);
    if constexpr (kGateUp) {
      if (n_ok) F::load16(g.b_up, u_row, k0 + sk, v);
#pragma unroll
      for (int i = 0; i < 16; ++i) Bu[sr][sk + i] = __float2bfloat16(n_ok ? v[i] : 0.0f);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &As[wm * 32 + i * 16][kk], kTileK + kPad);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &Bs[wn * 32 + j * 16][kk], kTileK + kPad);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      if constexpr (kGateUp) {
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &Bu[wn * 32 + j * 16][kk], kTileK + kPad);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 2; ++j) wmma::mma_sync(acc_up[i][j], fa[i], fb[j], acc_up[i][j]);
      }
    }
    __syncthreads();
  }
  float* sg = scratch[warp][0];
  float* su = scratch[warp][1];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(sg, acc[i][j], 16, wmma::mem_row_major);
      if constexpr (kGateUp) wmma::store_matrix_sync(su, acc_up[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      for (int q = lane; q < 256; q += 32) {
        const int r = wm * 32 + i * 16 + q / 16;
        const int64_t c = col0 + wn * 32 + j * 16 + q % 16;
        if (r >= rows || c >= g.N) continue;
        float value = sg[q];
        if constexpr (kGateUp) value = value / (1.0f + __expf(-value)) * su[q];
        g.out[(row0 + r) * g.N + c] = value;
      }
      __syncwarp();
    }
}

// out[t] = sum_s weight[t, s] * y[pos(t, s)], slots in order: blockIdx.x a
// token, 4 columns a thread (one 16-byte load a slot). One value a thread, with
// a 64-bit division each, took 67 us a layer at Qwen3-30B-A3B's 2,048-token
// chunk for 150 MB of traffic.
__global__ void moe_combine_kernel(const float* y, const int32_t* pair_pos, const float* weights, float* out,
                                   int64_t k, int64_t d) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int64_t t = blockIdx.x;
  const int64_t c = 4 * (int64_t(blockIdx.y) * blockDim.x + threadIdx.x);
  if (c >= d) return;
  float4 s = {0, 0, 0, 0};
  for (int64_t j = 0; j < k; ++j) {
    const float w = weights[t * k + j];
    const float4 v = *reinterpret_cast<const float4*>(y + int64_t(pair_pos[t * k + j]) * d + c);
    s.x += w * v.x;
    s.y += w * v.y;
    s.z += w * v.z;
    s.w += w * v.w;
  }
  *reinterpret_cast<float4*>(out + t * d + c) = s;
}

// d is a multiple of 32 (moe_experts checks), y 256-byte aligned scratch.
cudaError_t launch_moe_combine(const float* y, const int32_t* pair_pos, const float* weights, float* out, int64_t T,
                               int64_t k, int64_t d, cudaStream_t stream) {
  if (T == 0 || d == 0) return cudaSuccess;
  if (T >= (int64_t(1) << 31) || d % 4 || reinterpret_cast<uintptr_t>(out) % 16) return cudaErrorInvalidValue;
  return launch_kernel(moe_combine_kernel, row_grid(T, d, 4), dim3(kRowThreads), 0, stream, y, pair_pos, weights, out,
                       k, d);
}

__global__ void add_gated_kernel(float* out, const float* y, const float* gate, int64_t T, int64_t d) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T * d; i += int64_t(gridDim.x) * blockDim.x)
    out[i] += gate ? y[i] / (1.0f + __expf(-gate[i / d])) : y[i];
}

// Where each prefill scratch array starts (256-byte aligned). `act`: the
// activations [P, f] f32, or (on the grouped affine GEMM) the gate and up
// products [2][P][f]; x_bf16 and act_bf16, that GEMM's inputs (else empty).
struct PrefillScratch {
  size_t counts, offsets, tile_offsets, cursor, sorted_pair, pair_pos, act, y, x_bf16, act_bf16, total;
  PrefillScratch(int64_t T, int64_t k, int64_t E, int64_t d, int64_t f, bool tensor_core_grouped) {
    size_t at = 0;
    auto take = [&](size_t bytes) {
      const size_t start = at;
      at += (bytes + 255) / 256 * 256;
      return start;
    };
    const int64_t P = T * k;
    counts = take(size_t(E) * 4);
    offsets = take(size_t(E + 1) * 4);
    tile_offsets = take(size_t(E + 1) * 4);
    cursor = take(size_t(E) * 4);
    sorted_pair = take(size_t(P) * 4);
    pair_pos = take(size_t(P) * 4);
    act = take(size_t(P) * size_t(f) * 4 * (tensor_core_grouped ? 2 : 1));
    y = take(size_t(P) * size_t(d) * 4);
    x_bf16 = take(tensor_core_grouped ? size_t(P) * size_t(d) * 2 : 0);
    act_bf16 = take(tensor_core_grouped ? size_t(P) * size_t(f) * 2 : 0);
    total = at;
  }
};

// The grouped affine GEMM's token tiles: 32, 64 or 128 pairs, by how many an
// expert gets on average (the rows past an expert's pairs are wasted MMAs).
int grouped_tokens(int64_t P, int64_t E) {
  const int64_t experts = P < E ? P : E, average = (P + experts - 1) / experts;
  return average <= 32 ? 32 : average <= 64 ? 64 : 128;
}

// The grouped affine GEMM over expert matrix m: MLX affine stacks under lever
// tensor_core_affine_moe_gemm, bf16 and FP8 ones under tensor_core_dense_moe_gemm;
// nullopt for the others (f32 and f16 values, or a lever off).
std::optional<AffineGroupedGemm> grouped_gemm_of(const ExpertMatrix& m, const MoeExpertsArgs& a) {
  AffineGroupedGemm g{.w = {.packed = static_cast<const uint32_t*>(m.w), .scales = m.scales, .biases = m.biases,
                            .scale_dtype = m.dtype, .bits = m.bits, .group_size = m.group_size, .in = m.cols,
                            .out = m.rows},
                      .expert_stride = m.expert_stride, .E = int(a.n_experts), .P = a.T * a.k,
                      .tokens = grouped_tokens(a.T * a.k, a.n_experts)};
  if (m.bits != 0) {
    if (!tensor_core_affine_moe_gemm_enabled()) return std::nullopt;
  } else if (tensor_core_dense_moe_gemm_enabled() && (m.dtype == DType::bf16 || m.dtype == DType::f8_e4m3)) {
    g.kind = m.dtype == DType::bf16 ? GroupedWeights::bf16 : GroupedWeights::fp8;
  } else {
    return std::nullopt;
  }
  if (!affine_grouped_gemm_supports(g)) return std::nullopt;
  return g;
}

// Bits of the grouped GEMM's input order for matrix m (4: permuted within 64s).
int input_bits(const ExpertMatrix& m) { return m.bits == 4 ? 4 : 16; }

// Whether the prefill takes the grouped affine GEMM: each matrix one it takes
// (grouped_gemm_of), gate and up reading x in the same order (they share its image).
bool tensor_core_grouped(const MoeExpertsArgs& a) {
  return input_bits(a.gate) == input_bits(a.up) && grouped_gemm_of(a.gate, a) && grouped_gemm_of(a.up, a) &&
         grouped_gemm_of(a.down, a);
}

// Gate/up (SwiGLU in its epilogue) and down as the WMMA grouped GEMMs over the
// sorted pairs, into y [P, d_model] (sorted rows).
cudaError_t run_wmma_grouped(const MoeExpertsArgs& a, const PrefillScratch& s, char* base, cudaStream_t stream) {
  const int64_t P = a.T * a.k;
  const int E = int(a.n_experts);
  auto ints = [&](size_t offset) { return reinterpret_cast<const int32_t*>(base + offset); };
  float* act = reinterpret_cast<float*>(base + s.act);
  // At most P / 64 + E row tiles (each expert's last tile may be partial); the rest exit at once.
  const unsigned max_tiles = unsigned(ceil_div(P, kTileM) + E);
  GemmArgs up{.b = a.gate, .b_up = a.up, .a = a.x, .a_by_token = true, .sorted_pair = ints(s.sorted_pair),
              .offsets = ints(s.offsets), .tile_offsets = ints(s.tile_offsets), .out = act, .k_slots = a.k,
              .K = a.d_model, .N = a.d_ff, .E = E};
  cudaError_t err = visit_format(a.gate, [&]<typename F>() {
    launch_kernel(moe_grouped_gemm<F, true>, dim3(unsigned(ceil_div(a.d_ff, kTileN)), max_tiles), dim3(128), 0,
                  stream, up);
  });
  if (err != cudaSuccess) return err;
  GemmArgs down{.b = a.down, .b_up = a.down, .a = act, .a_by_token = false, .sorted_pair = ints(s.sorted_pair),
                .offsets = ints(s.offsets), .tile_offsets = ints(s.tile_offsets),
                .out = reinterpret_cast<float*>(base + s.y), .k_slots = a.k, .K = a.d_ff, .N = a.d_model, .E = E};
  return visit_format(a.down, [&]<typename F>() {
    launch_kernel(moe_grouped_gemm<F, false>, dim3(unsigned(ceil_div(a.d_model, kTileN)), max_tiles), dim3(128), 0,
                  stream, down);
  });
}

// Gate/up and down as the affine GEMMs grouped by expert over the sorted pairs:
// x gathered into bf16 rows, the gate and up products, SwiGLU's product in
// bf16, then down into y [P, d_model] (sorted rows). tensor_core_grouped(a).
cudaError_t run_tensor_core_grouped(const MoeExpertsArgs& a, const PrefillScratch& s, char* base,
                                    cudaStream_t stream) {
  const int64_t P = a.T * a.k;
  auto ints = [&](size_t offset) { return reinterpret_cast<const int32_t*>(base + offset); };
  float* gate = reinterpret_cast<float*>(base + s.act);
  float* up = gate + P * a.d_ff;
  void* x_bf16 = base + s.x_bf16;
  void* act_bf16 = base + s.act_bf16;
  auto run = [&](const ExpertMatrix& m, const void* x, float* y) {
    AffineGroupedGemm g = *grouped_gemm_of(m, a);
    g.x_bf16 = x, g.offsets = ints(s.offsets), g.tile_offsets = ints(s.tile_offsets), g.y = y;
    return launch_affine_grouped_gemm(g, stream);
  };
  cudaError_t err =
      launch_affine_grouped_input(a.x, ints(s.sorted_pair), a.k, P, a.d_model, input_bits(a.gate), x_bf16, stream);
  AffineGroupedGemm g = *grouped_gemm_of(a.gate, a), u = *grouped_gemm_of(a.up, a);
  g.x_bf16 = u.x_bf16 = x_bf16, g.offsets = u.offsets = ints(s.offsets);
  g.tile_offsets = u.tile_offsets = ints(s.tile_offsets);
  // Lever grouped_swiglu_epilogue: gate and up as one launch, SwiGLU in its epilogue.
  if (grouped_swiglu_epilogue_enabled() && affine_grouped_swiglu_gemm_supports(g, u)) {
    if (err == cudaSuccess) err = launch_affine_grouped_swiglu_gemm(g, u, input_bits(a.down), act_bf16, stream);
  } else {
    if (err == cudaSuccess) err = run(a.gate, x_bf16, gate);
    if (err == cudaSuccess) err = run(a.up, x_bf16, up);
    if (err == cudaSuccess)
      err = launch_affine_grouped_swiglu(gate, up, P, a.d_ff, input_bits(a.down), act_bf16, stream);
  }
  if (err == cudaSuccess) err = run(a.down, act_bf16, reinterpret_cast<float*>(base + s.y));
  return err;
}

}  // namespace

bool moe_matrix_supported(const ExpertMatrix& m) {
  if (m.cols % 32 != 0) return false;
  if (m.dtype == DType::f8_e4m3)  // an expert's rows (and the up half's first row) start whole block rows
    return m.bits == 0 && m.group_size == Fp8::kBlock && m.rows % Fp8::kBlock == 0 &&
           m.expert_stride % Fp8::kBlock == 0;
  if (m.bits == 0) return m.dtype == DType::f32 || m.dtype == DType::f16 || m.dtype == DType::bf16;
  return (m.bits == 4 || m.bits == 8) && (m.group_size == 32 || m.group_size == 64 || m.group_size == 128);
}

cudaError_t launch_moe_route(const MoeRouteArgs& a, cudaStream_t stream) {
  if (a.E > kMaxRoutedExperts || a.k > 32 || a.k < 1) return cudaErrorInvalidValue;
  if (a.T == 0) return cudaSuccess;
  return launch_kernel(moe_route_kernel, dim3(unsigned(a.T)), dim3(kRouteThreads), 0, stream, a);
}

cudaError_t launch_moe_experts_decode(const MoeExpertsArgs& a, float* act, cudaStream_t stream) {
  if (a.T * a.k > 65535) return cudaErrorInvalidValue;  // one grid row per (token, slot)
  cudaError_t err = visit_format(a.gate, [&]<typename F>() {
    with_batch(ceil_div(a.d_model / F::kValues, 32), 4, [&]<int kBatch>() {  // two rows a lane
      const auto kernel = moe_gate_up_decode<F, kBatch>;
      const size_t bytes = staged_bytes<F>(a.d_model);
      if (bytes > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
      const int rows = gate_up_rows_per_warp(a);
      const dim3 grid(unsigned(ceil_div(a.d_ff, int64_t(kWarps) * rows)), unsigned(a.T * a.k));
      launch_kernel(kernel, grid, dim3(kWarps * 32), bytes, stream, a, act, rows);
    });
  });
  if (err != cudaSuccess) return err;
  return visit_format(a.down, [&]<typename F>() {
    with_batch(ceil_div(a.k * (a.d_ff / F::kValues), 32), 8, [&]<int kBatch>() {
      const auto kernel = moe_down_decode<F, kBatch>;
      const size_t bytes = staged_bytes<F>(a.k * a.d_ff);
      if (bytes > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
      const dim3 grid(unsigned(ceil_div(a.d_model, kWarps)), unsigned(a.T));
      launch_kernel(kernel, grid, dim3(kWarps * 32), bytes, stream, a, static_cast<const float*>(act));
    });
  });
}

size_t moe_prefill_scratch_bytes(const MoeExpertsArgs& a) {
  return PrefillScratch(a.T, a.k, a.n_experts, a.d_model, a.d_ff, tensor_core_grouped(a)).total;
}

cudaError_t launch_moe_experts_prefill(const MoeExpertsArgs& a, void* scratch, cudaStream_t stream) {
  const bool grouped = tensor_core_grouped(a);
  const PrefillScratch s(a.T, a.k, a.n_experts, a.d_model, a.d_ff, grouped);
  char* base = static_cast<char*>(scratch);
  auto ints = [&](size_t offset) { return reinterpret_cast<int32_t*>(base + offset); };
  const float* y = reinterpret_cast<const float*>(base + s.y);
  const int64_t P = a.T * a.k;
  const int E = int(a.n_experts);
  if (cudaError_t err = cudaMemsetAsync(ints(s.counts), 0, size_t(E) * 4, stream); err != cudaSuccess) return err;
  const int blocks = grid_for(P), tile = grouped ? grouped_tokens(P, E) : kTileM;
  launch_kernel(moe_count_kernel, dim3(blocks), dim3(256), 0, stream, a.ids, P, ints(s.counts));
  launch_kernel(moe_scan_kernel, dim3(1), dim3(32), 0, stream, static_cast<const int32_t*>(ints(s.counts)), E, tile,
                ints(s.offsets), ints(s.tile_offsets), ints(s.cursor));
  launch_kernel(moe_scatter_kernel, dim3(blocks), dim3(256), 0, stream, a.ids, P, ints(s.cursor), ints(s.sorted_pair),
                ints(s.pair_pos));
  cudaError_t err = grouped ? run_tensor_core_grouped(a, s, base, stream) : run_wmma_grouped(a, s, base, stream);
  if (err != cudaSuccess) return err;
  return launch_moe_combine(y, static_cast<const int32_t*>(ints(s.pair_pos)), a.weights, a.out, a.T, a.k, a.d_model,
                            stream);
}

cudaError_t launch_add_gated(float* out, const float* y, const float* gate, int64_t T, int64_t d,
                             cudaStream_t stream) {
  return launch_kernel(add_gated_kernel, dim3(grid_for(T * d)), dim3(256), 0, stream, out, y, gate, T, d);
}

}  // namespace mere::cuda
