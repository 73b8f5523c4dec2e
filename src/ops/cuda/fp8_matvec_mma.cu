// FP8 E4M3 decode matvecs (T <= 8 tokens, 128x128 block scales) on the tensor
// cores: lever tensor_core_fp8_matvec (fp8_ops.cpp).
//
// Why: the CUDA-core kernel (fp8_matvec.cu) converts and multiplies every
// weight once per token, so its rate falls with the tokens (Llama-3-8B shapes:
// 12-25% of the roofline at 8). Here a 16-row tile of weights is the A operand
// of f16 mmas (m16n8k16, f32 sums): E4M3 converts to f16 exactly, two values an
// instruction, and T = 8 costs the weight reads of T = 1 plus one more mma a step.
//
// Exactness: per token and 128-column block, x is scaled by the power of two
// 2^k that puts its largest |x| in [2^14, 2^15) and split into two f16, hi =
// f16(x 2^k) and lo = f16(x 2^k - hi): 22 significant bits. A token takes two
// B columns (hi, lo), so four tokens share an mma (T <= 4 one a step, T <= 8
// two). A product of an E4M3 value (4 significant bits) and an f16 (11) is
// exact in f32, and the mma sums in f32. Per stage (one 128-column block) the
// lane holding a token's two columns adds them and scales the sum by the
// block's weight scale and 2^-k.
//
// Shape (as affine_matvec_mma.cu): a first kernel converts x into the image a
// block stages in shared memory (rows 2t and 2t + 1: token t's hi and lo, f16,
// in column order; then 2^-k per token and block). For the fused decode forms
// (lever fused_norm_matvec) that kernel also forms the input, RMSNorm(h) w,
// silu(gate) up or attention's split-K partials merged, and the matvec adds its
// product into y (the residual). Each warp streams its 16-row
// tiles, 128 bytes of each row and the tile's block scale a stage, through a
// ring of cp.async stages; `split` warps share a tile's stages and add their
// sums in a fixed order. Lane (g, q) takes bytes [32 j + 8 q, +8) of rows g and
// g + 8 for k32 chunk j, and the same 8 columns of x from its B column's row:
// the first mma's k-slots 2q, 2q + 1 are columns +0, +1 and 2q + 8, 2q + 9
// columns +2, +3, the second mma's +4 to +7 likewise. A row too long for x in
// shared memory runs as launches of whole blocks, each adding into y.
// The MoE experts' decode (lever tensor_core_moe_matvec, moe_launchers.h) runs
// the kernel in the two more modes of affine_matvec_mma.cu: gate/up a block row
// per (token, slot) pair over its expert's gate then up rows, down a block row
// per token over its k experts' rows side by side (warp s of a tile on slot s),
// over one image per token; under lever routing_in_experts the gate/up blocks
// route their token themselves (moe_routing.cuh, routed_block).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "ops/cuda/attention_split.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/fp8_launchers.h"
#include "ops/cuda/launchers.h"
#include "ops/cuda/matvec_tiles.cuh"
#include "ops/cuda/moe_launchers.h"
#include "ops/cuda/moe_routing.cuh"

namespace mere::cuda {
namespace {

using tiles::kDense;
using tiles::kMoeDown;
using tiles::kMoeGateUp;
using tiles::kTileRows;
using tiles::kWarps;
constexpr int kBlock = 128;                          // columns (bytes) of a stage: one scale block
constexpr int kRowStride = kBlock + 32;              // 8-byte loads of 4 rows hit every bank once
constexpr int kCodeBytes = kTileRows * kRowStride;   // a stage's weights
constexpr int kStageBytes = kCodeBytes + 16;         // and the tile's block scale
constexpr int kStages = 3;
constexpr int kTop = 15;     // the largest |x 2^k| of a token's block lies in [2^(kTop - 1), 2^kTop)
constexpr int kMaxParts = 8;  // launches a row may be cut into (x too long for shared memory)

__host__ __device__ constexpr int mmas_for(int T) { return (T + 3) / 4; }

struct Problem {
  const uint8_t* values;  // the launch's first column of row 0; rows row_bytes apart
  const float* scales;    // the launch's first block column of block row 0; rows scale_stride apart
  int64_t row_bytes;
  int scale_stride;
  const uint8_t* staged;  // x converted (prepare kernel): the image of a block's x and factors
  int x_stride;           // bytes per staged row (hi or lo of a token)
  int64_t x_bytes, staged_bytes;
  const float* bias;
  float* y;
  bool accumulate;  // y += the product (a later launch of a cut row), else y =
  bool streamed_weights;  // the weights' copies evict first from L2 (lever streamed_weights)
  int out, T;
  int n_blocks;  // the launch's 128-column blocks
  int split;     // warps per tile
  int n_units;   // units of kWarps / split tiles
  // Mixture of experts (kMode != kDense), as affine_matvec_mma.cu's Problem.
  const int32_t* ids;  // [T, k]
  int k, d_ff, pairs;
  int64_t expert_stride;  // rows from one expert's first row to the next's (whole scale blocks)
  const uint8_t* up_values;
  const float* up_scales;
  int64_t image_bytes;  // one token's staged image
  // Gate/up under lever routing_in_experts (route.logits set): each block routes
  // its token before its wait (moe_routing.cuh, routed_block).
  MoeRouteArgs route;
};



// The converted x and the start of a block's shared memory: rows [2 T][in + pad]
// of f16 (token t's hi, then lo), then 2^-k per token and block [T][n_blocks]
// f32, then the warps' rings and their partial sums [kWarps][mmas][32] float2.
struct Layout {
  int x_stride;
  int64_t x_bytes, staged_bytes, total;
};
Layout layout(int64_t in, int64_t T) {
  Layout l;
  l.x_stride = int(2 * in + 64);  // 2 in is a multiple of 256: rows 64 bytes apart mod 128
  l.x_bytes = 2 * T * l.x_stride;
  // The factors padded so that the rings after them start on 32 bytes (the
  // affine kernel's rings 16 bytes off cost up to 10%: docs/benchmarks.md).
  l.staged_bytes = l.x_bytes + (T * (in / kBlock) * 4 + 31) / 32 * 32;
  l.total = l.staged_bytes + int64_t(kWarps) * kStages * kStageBytes + int64_t(kWarps) * mmas_for(int(T)) * 32 * 8;
  return l;
}

// d += a b: a 16x16 tile of f16 weights, b 16x8 f16 (x's hi and lo columns), f32 sums.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two E4M3 values (the low 16 bits, first in the low byte) as an f16 pair, exactly.
__device__ __forceinline__ uint32_t f16_pair(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

__device__ __forceinline__ void copy_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}

// One launch of the prepare kernel below: its input (mma_input.h) and where
// the images go. A row cut into launches (x too long for shared memory) has one
// image per launch's columns, part_bytes apart.
struct Prepare {
  // [T, in]; kRmsNormed: h [T, in]; kSiluGated: gate_up [T, 2 in];
  // kAttentionSplits: the partial outputs [T, heads, splits, head_dim]
  const float* x;
  const void* norm_w;
  float eps;
  int T, in, part_in, x_stride;  // part_in: the columns of one matvec launch
  uint8_t* staged;               // part k's image at staged + k part_bytes
  int64_t x_bytes, part_bytes;
  const float *split_max, *split_sum;  // kAttentionSplits: [T, heads, splits]
  int splits, head_dim, live_splits;   // live_splits: the first ones, the rest empty and not read
  // kSiluGated for the MoE experts' down: column e's product is scaled by the
  // routing weight pair_weights[e / pair_cols] of its (token, slot) pair.
  const float* pair_weights;
  int pair_cols;
  // The next kernel may start only after this one's wait, so that it can read
  // what the kernel before this one wrote (the routing's ids) before its own.
  bool allow_after_wait;
};

// Row t's sum of squares, f32, in the same order in every block: a thread's
// float4s (all loads issued before the first add for rows up to 8 K values),
// then the warps' sums in warp order. Every thread of the block calls it.
__device__ __forceinline__ float row_sum_of_squares(const float* row, int n) {
  const float4* row4 = reinterpret_cast<const float4*>(row);
  const int quads = n / 4;
  constexpr int kAtOnce = 8;
  float4 held[kAtOnce];
#pragma unroll
  for (int k = 0; k < kAtOnce; ++k) {
    const int s = threadIdx.x + k * blockDim.x;
    held[k] = s < quads ? __ldg(row4 + s) : make_float4(0, 0, 0, 0);
  }
  float sum = 0;
  auto add = [&sum](const float4& a) { sum += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w; };
#pragma unroll
  for (int k = 0; k < kAtOnce; ++k) add(held[k]);
  for (int s = threadIdx.x + kAtOnce * blockDim.x; s < quads; s += blockDim.x) add(__ldg(row4 + s));
  __shared__ float partial[32];
  sum = warp_sum(sum);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < int(blockDim.x) / 32; ++w) total += partial[w];
  return total;
}

// A warp's (token t, 128-column block b) into its part's image, lane l holding
// columns 4 l to 4 l + 3: per token and block, x scaled by the power of two
// that puts its largest |x| in [2^14, 2^15), as two f16 (hi, lo) and 2^-k.
__device__ __forceinline__ void stage_block(const Prepare& p, int t, int b, const float (&v)[4]) {
  const int lane = threadIdx.x % 32;
  float amax = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) amax = fmaxf(amax, isfinite(v[j]) ? fabsf(v[j]) : INFINITY);  // NaN counts as inf
#pragma unroll
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const bool finite = amax <= 3.4e38f;
  // amax in [2^(exponent-1), 2^exponent)
  const int exponent = amax > 0 && finite ? max(frexp_exponent(amax), -100) : 0;
  const float up = exp2_int(kTop - exponent);
  const float down = finite ? exp2_int(exponent - kTop) : __int_as_float(0x7fc00000);
  uint32_t hi[2] = {}, lo[2] = {};  // f16 pairs, the first value in the low half
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float s = finite ? v[j] * up : 0.0f;
    const __half h = __float2half_rn(s), l = __float2half_rn(s - __half2float(h));
    hi[j / 2] |= uint32_t(__half_as_ushort(h)) << (16 * (j % 2));
    lo[j / 2] |= uint32_t(__half_as_ushort(l)) << (16 * (j % 2));
  }
  const int k = b * kBlock / p.part_in, col = b * kBlock - k * p.part_in;  // the part, and the column in it
  uint8_t* image = p.staged + k * p.part_bytes;
  *reinterpret_cast<uint2*>(image + int64_t(2 * t) * p.x_stride + 2 * (col + 4 * lane)) = make_uint2(hi[0], hi[1]);
  *reinterpret_cast<uint2*>(image + int64_t(2 * t + 1) * p.x_stride + 2 * (col + 4 * lane)) = make_uint2(lo[0], lo[1]);
  if (lane == 0) reinterpret_cast<float*>(image + p.x_bytes)[t * (p.part_in / kBlock) + col / kBlock] = down;
}

// The input (every kind but kAttentionSplits, below) into the parts' images: a
// warp a (token, 128-column block), a lane 4 values. kRmsNormed: blocks (b, t) take token t's blocks from 8 b, each
// first summing the squares of the whole row for RMSNorm (one block a token
// would leave the other SMs idle at one token). A block holding inf or NaN
// gives NaN rows, as the f32 product would.
template <int kKind, typename N>
__global__ void __launch_bounds__(256) fp8_mma_prepare_kernel(const __grid_constant__ Prepare p) {
  using Kind = MmaInput::Kind;
  constexpr bool kNormed = kKind == int(Kind::rms_normed);
  if (!p.allow_after_wait) allow_next_kernel();
  const int lane = threadIdx.x % 32, blocks = p.in / kBlock;
  const int item = blockIdx.x * 8 + threadIdx.x / 32;
  const bool active = item < (kNormed ? blocks : p.T * blocks);
  const int t = kNormed ? int(blockIdx.y) : (active ? item / blocks : 0);
  const int b = kNormed ? item : item - t * blocks;
  const int e = b * kBlock + 4 * lane;  // the lane's first column
  // RMSNorm: the norm weights never change in a forward, so they are read
  // before the wait (affine_matvec_mma.cu's prepare measured why).
  float weight[4] = {};
  if constexpr (kNormed) {
    const N* norm_w = static_cast<const N*>(p.norm_w) + e;
#pragma unroll
    for (int j = 0; j < 4; ++j) weight[j] = active ? to_float(norm_w[j]) : 0.0f;
  }
  wait_for_previous_kernel();
  if (p.allow_after_wait) allow_next_kernel();
  const int64_t row = int64_t(t) * p.in * (kKind == int(Kind::silu_gated) ? 2 : 1);
  const float4 v4 = active ? __ldg(reinterpret_cast<const float4*>(p.x + row + e)) : make_float4(0, 0, 0, 0);
  float v[4] = {v4.x, v4.y, v4.z, v4.w};
  if constexpr (kKind == int(Kind::silu_gated)) {
    const float4 u4 = active ? __ldg(reinterpret_cast<const float4*>(p.x + row + p.in + e)) : v4;
    const float u[4] = {u4.x, u4.y, u4.z, u4.w};
    const float w = p.pair_weights && active ? __ldg(p.pair_weights + e / p.pair_cols) : 1.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = v[j] / (1.0f + __expf(-v[j])) * u[j] * w;  // as silu_mul_halves
  }
  if constexpr (kNormed) {
    const float inv = rsqrtf(row_sum_of_squares(p.x + row, p.in) / float(p.in) + p.eps);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = weight[j] * (v[j] * inv);  // RMSNorm(h) w, as rms_norm
  }
  if (active) stage_block(p, t, b, v);  // items are whole warps
}

// Attention's split-K partials merged into o_proj's input (kAttentionSplits),
// with attention_merge_kernel's formula (its sums in another order): a block a
// (token, 128-column block), its warp w the splits w, w + W, ... (up to 8, every
// load issued at once), a lane 4 columns of its head. The warps' maxima, sums
// and outputs then meet in warp order, and warp 0 stages the merged block.
constexpr int kSplitsPerWarp = kSplitsPerMergeWarp;

__global__ void __launch_bounds__(kMaxAttentionSplits / kSplitsPerWarp * 32)
    fp8_mma_prepare_splits_kernel(const __grid_constant__ Prepare p) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int blocks = p.in / kBlock, t = blockIdx.x / blocks, b = blockIdx.x - t * blocks;
  const int e = b * kBlock + 4 * lane, head = e / p.head_dim, d = e - head * p.head_dim;
  const int64_t base = (int64_t(t) * (p.in / p.head_dim) + head) * p.splits;
  float ms[kSplitsPerWarp], ls[kSplitsPerWarp], os[kSplitsPerWarp][4];
#pragma unroll
  for (int k = 0; k < kSplitsPerWarp; ++k) {
    const int s = warp + k * warps;
    const bool used = s < p.live_splits;
    ms[k] = used ? __ldg(p.split_max + base + s) : -INFINITY;
    ls[k] = used ? __ldg(p.split_sum + base + s) : 0.0f;
    const float4 o =
        used ? __ldg(reinterpret_cast<const float4*>(p.x + (base + s) * p.head_dim + d)) : make_float4(0, 0, 0, 0);
    os[k][0] = o.x, os[k][1] = o.y, os[k][2] = o.z, os[k][3] = o.w;
  }
  float v[4];
  if (!merge_split_partials<4, kMaxAttentionSplits / kSplitsPerWarp>(ms, ls, os, v)) return;
  stage_block(p, t, b, v);
}

// Block b takes units b, b + gridDim.x, ...; a unit is kWarps / split tiles of
// 16 rows, warp w its tile w / split and the share w % split of its stages.
template <int kMmas, int kMode, bool kWarpRouted = false>
__global__ void __launch_bounds__(kWarps * 32) fp8_matvec_mma_kernel(const __grid_constant__ Problem p) {
  static_assert(!kWarpRouted || kStages * kStageBytes >= kWarpRoutingBytes, "a warp routes in its own ring");
  extern __shared__ __align__(16) uint8_t smem[];
  const float* factors = reinterpret_cast<const float*>(smem + p.x_bytes);
  uint8_t* ring = smem + p.staged_bytes + int64_t(threadIdx.x / 32) * kStages * kStageBytes;
  float2* partial = reinterpret_cast<float2*>(smem + p.staged_bytes + int64_t(kWarps) * kStages * kStageBytes);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int tiles_per_unit = kWarps / p.split, part = warp % p.split;
  const int stage_begin = part * p.n_blocks / p.split, stage_end = (part + 1) * p.n_blocks / p.split;
  const int my_units = (p.n_units - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
  const int n_stages = my_units * (stage_end - stage_begin);

  // Mixture of experts: the block's token and its expert's rows (up rows from d_ff on).
  const tiles::MoeBlock moe = kMode == kMoeGateUp && p.route.logits
                                  ? routed_block<kWarpRouted>(p, smem, ring)
                                  : tiles::moe_block<kMode>(p.ids, p.k, p.expert_stride, part);
  const int token = moe.token, slot = moe.slot;
  const int64_t expert_row0 = moe.expert_row0, up_row0 = expert_row0 - p.d_ff;
  const int slot_blocks = int(p.row_bytes / kBlock);  // down: a slot's stages
  auto values_of = [&](int row) -> const uint8_t* {
    if constexpr (kMode == kMoeGateUp)
      if (row >= p.d_ff) return p.up_values + (up_row0 + row) * p.row_bytes;
    return p.values + (expert_row0 + row - slot) * p.row_bytes;
  };
  auto scales_of = [&](int row) -> const float* {  // the row's block row, as the stages index it
    if constexpr (kMode == kMoeGateUp)
      if (row >= p.d_ff) return p.up_scales + (up_row0 + row) / kBlock * p.scale_stride;
    return p.scales + (expert_row0 + row) / kBlock * p.scale_stride - slot * slot_blocks;
  };

  // Copy u of a lane takes chunk lane % 8 of row lane / 8 + 4 u; lane 0 copies
  // the tile's block scale. Shared addresses are kept as offsets.
  const uint32_t ring_addr = smem_address(ring), ring_end = ring_addr + kStages * kStageBytes;
  const uint32_t copy_dst = (lane / 8) * kRowStride + (lane % 8) * 16;
  int issue_row0 = (int(blockIdx.x) * tiles_per_unit + warp / p.split) * kTileRows, issue_stage = stage_begin;
  const int unit_rows = int(gridDim.x) * tiles_per_unit * kTileRows;
  const uint8_t* copy_src[4];
  const float* scale_src;
  auto point_at_tile = [&]() {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int row = min(issue_row0 + lane / 8 + 4 * u, p.out - 1);
      copy_src[u] = values_of(row) + (lane % 8) * 16;
    }
    scale_src = scales_of(min(issue_row0, p.out - 1));
  };
  point_at_tile();
  uint32_t issue_addr = ring_addr;
  // Lever streamed_weights (affine_matvec_mma.cu): the weights go first from L2.
  const bool hinted = p.streamed_weights;
  const uint64_t evict_first = l2_evict_first();
  auto issue = [&]() {
#pragma unroll
    for (int u = 0; u < 4; ++u)
      copy_async_16_hinted(issue_addr + copy_dst + u * 4 * kRowStride, copy_src[u] + issue_stage * kBlock, hinted,
                           evict_first);
    if (lane == 0) copy_async_4(issue_addr + kCodeBytes, scale_src + issue_stage);
    issue_addr += kStageBytes;
    if (issue_addr == ring_end) issue_addr = ring_addr;
    if (++issue_stage == stage_end) {
      issue_stage = stage_begin;
      issue_row0 += unit_rows;
      point_at_tile();
    }
  };

  tiles::issue_first_stages<kStages>(issue, n_stages);
  allow_next_kernel();
  wait_for_previous_kernel();
  // What a writing lane (part 0, its token below T) adds its rows' sums to: y
  // itself when accumulating, and the bias; read once y is final.
  float prior[kMmas][2], bias[2];
  auto read_tile_addends = [&](int first_row) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row + g + 8 * h;
      bias[h] = p.bias && row < p.out && part == 0 ? p.bias[row] : 0.0f;
#pragma unroll
      for (int m = 0; m < kMmas; ++m) {
        const int t = 4 * m + q;
        const bool writes = part == 0 && t < p.T && row < p.out;
        prior[m][h] = p.accumulate && writes ? p.y[int64_t(t) * p.out + row] : 0.0f;
      }
    }
  };
  read_tile_addends((int(blockIdx.x) * tiles_per_unit + warp / p.split) * kTileRows);
  tiles::load_staged_x(smem, p.staged + token * p.image_bytes, p.staged_bytes);

  // B: lane g loads column 8 m + g, the hi (g even) or lo row of token 4 m + g / 2;
  // tokens past T load the last token's rows, and their sums are never written.
  const uint8_t* b_row[kMmas];
#pragma unroll
  for (int m = 0; m < kMmas; ++m)
    b_row[m] = smem + int64_t(2 * min(4 * m + g / 2, p.T - 1) + g % 2) * p.x_stride + q * 16;
  float acc[kMmas][2] = {};  // per mma: rows g and g + 8 of token 4 m + q
  int row0 = (int(blockIdx.x) * tiles_per_unit + warp / p.split) * kTileRows, stage = stage_begin;
  uint32_t slot_addr = ring_addr;

  for (int i = 0; i < n_stages; ++i) {
    if (i + kStages - 1 < n_stages) issue();
    copy_async_commit();
    copy_async_wait<kStages - 1>();
    __syncwarp();
    const uint8_t* slot = ring + (slot_addr - ring_addr);
    slot_addr += kStageBytes;
    if (slot_addr == ring_end) slot_addr = ring_addr;
    // Two chains of sums (the chunks' first and second mmas), so that no mma
    // waits for the one before it.
    float c[2][kMmas][4] = {};
    const int x_at = stage * 2 * kBlock;  // the block's columns in x's rows (f16)
#pragma unroll
    for (int j = 0; j < kBlock / 32; ++j) {
      const uint2 top = *reinterpret_cast<const uint2*>(slot + g * kRowStride + 32 * j + 8 * q);
      const uint2 bottom = *reinterpret_cast<const uint2*>(slot + (g + 8) * kRowStride + 32 * j + 8 * q);
      const uint32_t first[4] = {f16_pair(top.x), f16_pair(bottom.x), f16_pair(top.x >> 16), f16_pair(bottom.x >> 16)};
      const uint32_t second[4] = {f16_pair(top.y), f16_pair(bottom.y), f16_pair(top.y >> 16),
                                  f16_pair(bottom.y >> 16)};
#pragma unroll
      for (int m = 0; m < kMmas; ++m) {
        const uint4 xv = *reinterpret_cast<const uint4*>(b_row[m] + x_at + 64 * j);  // columns 32 j + 8 q, +8
        mma(c[0][m], first, xv.x, xv.y);
        mma(c[1][m], second, xv.z, xv.w);
      }
    }
    const float scale = *reinterpret_cast<const float*>(slot + kCodeBytes);
#pragma unroll
    for (int m = 0; m < kMmas; ++m) {
      const int t = 4 * m + q;
      const float f = t < p.T ? scale * factors[t * p.n_blocks + stage] : 0.0f;
      acc[m][0] = fmaf(f, (c[0][m][0] + c[1][m][0]) + (c[0][m][1] + c[1][m][1]), acc[m][0]);  // hi + lo, row g
      acc[m][1] = fmaf(f, (c[0][m][2] + c[1][m][2]) + (c[0][m][3] + c[1][m][3]), acc[m][1]);  // row g + 8
    }
    __syncwarp();  // the slot is refilled next iteration
    if (++stage != stage_end) continue;

    // The tile's last stage: the split warps' sums meet in a fixed order.
    tiles::add_split_sums<kMmas>(acc, partial, p.split, warp, part, lane);
    if (part == 0) {
#pragma unroll
      for (int m = 0; m < kMmas; ++m) {
        const int t = 4 * m + q;
        if (t >= p.T) continue;
        float* y = tiles::output_row<kMode>(p.y, t, p.out, row0, p.d_ff, p.pairs, token);
        if (row0 + g < p.out) y[row0 + g] = prior[m][0] + (acc[m][0] + bias[0]);
        if (row0 + g + 8 < p.out) y[row0 + g + 8] = prior[m][1] + (acc[m][1] + bias[1]);
      }
    }
#pragma unroll
    for (int m = 0; m < kMmas; ++m) acc[m][0] = acc[m][1] = 0;
    stage = stage_begin;
    row0 += unit_rows;
    if (part == 0) read_tile_addends(row0);
  }
  copy_async_wait<0>();
}

// ---- host side ----

using tiles::max_smem;

// The launches a row is cut into: the fewest, of whole blocks each, whose x
// fits in a block's shared memory with the rings; 0 if none does.
int parts_for(int64_t in, int64_t T) {
  const int64_t blocks = in / kBlock;
  for (int parts = 1; parts <= kMaxParts; ++parts)
    if (blocks % parts == 0 && layout(in / parts, T).total <= max_smem()) return parts;
  return 0;
}

int64_t part_image_bytes(int64_t part_in, int64_t T) { return (layout(part_in, T).staged_bytes + 15) / 16 * 16; }

template <int kMmas, int kMode = kDense, bool kWarpRouted = false>
int blocks_per_sm(int64_t smem) {
  constexpr auto kernel = fp8_matvec_mma_kernel<kMmas, kMode, kWarpRouted>;
  static const cudaError_t raised =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem());
  (void)raised;
  int blocks = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kWarps * 32, size_t(smem));
  return blocks;
}

// The prepare kernel of `input` over the whole row (every part's image).
cudaError_t launch_prepare(const MmaInput& input, Prepare prep, cudaStream_t stream) {
  using Kind = MmaInput::Kind;
  const dim3 items(unsigned(ceil_div(prep.T * (prep.in / kBlock), 8)));      // a warp a (token, block)
  const dim3 token_items(unsigned(ceil_div(prep.in / kBlock, 8)), unsigned(prep.T));  // kRmsNormed
  switch (input.kind) {
    case Kind::rms_normed: {
      cudaError_t status = cudaSuccess;
      const cudaError_t visited = visit_float(input.norm_dtype, [&]<typename N>() {
        status = launch_kernel(fp8_mma_prepare_kernel<int(Kind::rms_normed), N>, token_items, dim3(256), 0, stream,
                               prep);
      });
      return visited != cudaSuccess ? visited : status;
    }
    case Kind::silu_gated:
      return launch_kernel(fp8_mma_prepare_kernel<int(Kind::silu_gated), float>, items, dim3(256), 0, stream, prep);
    case Kind::attention_splits:  // a block a (token, block), a warp per 8 of the splits read
      return launch_kernel(fp8_mma_prepare_splits_kernel, dim3(unsigned(prep.T * (prep.in / kBlock))),
                           dim3(unsigned(32 * ceil_div(prep.live_splits, kSplitsPerWarp))), 0, stream, prep);
    case Kind::plain: break;
  }
  return launch_kernel(fp8_mma_prepare_kernel<int(Kind::plain), float>, items, dim3(256), 0, stream, prep);
}

template <int kMmas>
cudaError_t launch_for(const MmaInput& input, const Fp8WeightView& w, const float* bias, float* y, int64_t T,
                       void* scratch, bool accumulate, cudaStream_t stream) {
  const int parts = parts_for(w.in, T);
  const int64_t in = w.in / parts;
  const Layout l = layout(in, T);
  const int per_sm = blocks_per_sm<kMmas>(l.total);
  if (per_sm < 1) return cudaErrorInvalidValue;
  const int64_t slots = int64_t(per_sm) * sm_count();
  const int n_tiles = int((w.out + kTileRows - 1) / kTileRows), n_blocks = int(in / kBlock);
  const int split = tiles::split_for(n_tiles, n_blocks, slots, kStages - 1);
  const int64_t part_bytes = part_image_bytes(in, T);
  // The splits the prepare kernel reads: those the attention grid wrote.
  const int live_splits = input.live_splits > 0 ? std::min(input.live_splits, input.splits) : input.splits;
  const Prepare prep{.x = input.x, .norm_w = input.norm_w, .eps = input.eps, .T = int(T), .in = int(w.in),
                     .part_in = int(in), .x_stride = l.x_stride, .staged = static_cast<uint8_t*>(scratch),
                     .x_bytes = l.x_bytes, .part_bytes = part_bytes, .split_max = input.split_max,
                     .split_sum = input.split_sum, .splits = input.splits, .head_dim = input.head_dim,
                     .live_splits = live_splits, .pair_weights = nullptr, .pair_cols = 1,
                     .allow_after_wait = false};
  cudaError_t status = launch_prepare(input, prep, stream);
  if (status != cudaSuccess) return status;
  Problem p{};
  p.streamed_weights = streamed_weights_enabled();
  p.row_bytes = w.in;
  p.scale_stride = int(w.scale_cols);
  p.x_stride = l.x_stride;
  p.x_bytes = l.x_bytes;
  p.staged_bytes = l.staged_bytes;
  p.y = y;
  p.out = int(w.out);
  p.T = int(T);
  p.n_blocks = n_blocks;
  p.split = split;
  p.n_units = (n_tiles + kWarps / split - 1) / (kWarps / split);
  const int grid = int(std::min<int64_t>(p.n_units, slots));
  for (int part = 0; part < parts; ++part) {
    const int64_t col0 = part * in;
    p.values = w.values + col0;
    p.scales = w.scale_inv + col0 / kBlock;
    p.staged = static_cast<const uint8_t*>(scratch) + part * part_bytes;
    p.bias = part == 0 ? bias : nullptr;
    p.accumulate = accumulate || part > 0;
    status = launch_kernel(fp8_matvec_mma_kernel<kMmas, kDense>, dim3(grid), dim3(kWarps * 32), size_t(l.total),
                           stream, p);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

// The experts' decode: whether stack `m` is read in whole blocks with `in`
// columns of one token's image a block.
bool moe_fits(const ExpertMatrix& m, int64_t in) {
  return m.dtype == DType::f8_e4m3 && m.group_size == kBlock && m.cols % kBlock == 0 && m.rows % kBlock == 0 &&
         m.expert_stride % kBlock == 0 && reinterpret_cast<uintptr_t>(m.w) % 16 == 0 && layout(in, 1).total <= max_smem();
}

// x [T, in] (or the gate/up products [2][T in], with pair_weights: silu(gate)
// up, as one row) into one image per token: a row of T in columns cut into parts of in.
cudaError_t prepare_moe(const float* x, int64_t T, int64_t in, const float* pair_weights, int64_t pair_cols,
                        uint8_t* staged, cudaStream_t stream) {
  const Layout l = layout(in, 1);
  const MmaInput input{.kind = pair_weights ? MmaInput::Kind::silu_gated : MmaInput::Kind::plain, .x = x};
  const Prepare prep{.x = x, .norm_w = nullptr, .eps = 0, .T = 1, .in = int(T * in), .part_in = int(in),
                     .x_stride = l.x_stride, .staged = staged, .x_bytes = l.x_bytes,
                     .part_bytes = part_image_bytes(in, 1), .split_max = nullptr, .split_sum = nullptr,
                     .splits = 0, .head_dim = 0, .live_splits = 0, .pair_weights = pair_weights,
                     .pair_cols = int(pair_cols), .allow_after_wait = true};
  return launch_prepare(input, prep, stream);
}

// Gate/up (`m` the gate stack, `up` the up stack) or down (`m` the down stack,
// `in` = k columns of it) over the images at `staged`; gate/up that routes its
// token (a.route) takes the kernel of warps that route alone where routes_in_a_warp.
template <int kMode, bool kWarpRouted = false>
cudaError_t launch_moe(const MoeExpertsArgs& a, const ExpertMatrix& m, const ExpertMatrix& up, int64_t in,
                       const uint8_t* staged, float* y, cudaStream_t stream) {
  if constexpr (kMode == kMoeGateUp && !kWarpRouted)
    if (a.route.logits && routes_in_a_warp(a.route))
      return launch_moe<kMode, true>(a, m, up, in, staged, y, stream);
  const Layout l = layout(in, 1);
  const int per_sm = blocks_per_sm<1, kMode, kWarpRouted>(l.total);
  if (per_sm < 1) return cudaErrorInvalidValue;
  const int64_t slots = int64_t(per_sm) * sm_count();
  const int64_t blocks_y = tiles::moe_block_rows<kMode>(a.T, a.k);
  const int out = tiles::moe_rows<kMode>(a.d_ff, a.d_model);
  const int n_tiles = (out + kTileRows - 1) / kTileRows, n_blocks = int(in / kBlock);
  Problem p{};
  p.streamed_weights = streamed_weights_enabled();
  p.values = static_cast<const uint8_t*>(m.w);
  p.scales = static_cast<const float*>(m.scales);
  p.row_bytes = m.cols;
  p.scale_stride = int(m.cols / kBlock);
  p.staged = staged;
  p.x_stride = l.x_stride;
  p.x_bytes = l.x_bytes;
  p.staged_bytes = l.staged_bytes;
  p.image_bytes = part_image_bytes(in, 1);
  p.y = y;
  p.out = out;
  p.T = 1;
  p.n_blocks = n_blocks;
  p.split = kMode == kMoeDown ? int(a.k) : tiles::split_for(int(n_tiles * blocks_y), n_blocks, slots, kStages - 1);
  p.n_units = (n_tiles + kWarps / p.split - 1) / (kWarps / p.split);
  p.ids = a.ids;
  p.k = int(a.k);
  p.d_ff = int(a.d_ff);
  p.pairs = int(a.T * a.k);
  p.expert_stride = m.expert_stride;
  p.up_values = static_cast<const uint8_t*>(up.w);
  p.up_scales = static_cast<const float*>(up.scales);
  if constexpr (kMode == kMoeGateUp) p.route = a.route;
  return launch_kernel(fp8_matvec_mma_kernel<1, kMode, kWarpRouted>, tiles::moe_grid(p.n_units, slots, blocks_y),
                       dim3(kWarps * 32), size_t(l.total), stream, p);
}

tiles::MoeScratch moe_scratch(const MoeExpertsArgs& a) {
  return tiles::moe_scratch(a.T, a.k, a.d_ff, part_image_bytes(a.d_model, 1), part_image_bytes(a.k * a.d_ff, 1));
}

}  // namespace

bool moe_experts_fp8_mma_supports(const MoeExpertsArgs& a) {
  if (a.T < 1 || a.T > kMaxFp8MatvecTokens || a.k < 1 || kWarps % a.k != 0 || a.d_ff % kBlock != 0 ||
      a.gate.cols != a.up.cols || a.gate.expert_stride != a.up.expert_stride || a.accumulate || a.norm_w)
    return false;
  if (!moe_fits(a.gate, a.d_model) || !moe_fits(a.up, a.d_model) || !moe_fits(a.down, a.k * a.d_ff)) return false;
  // Routing in gate/up: the routing scratch fits in a block's shared memory (x's image, then the rings).
  return !a.route.logits || (routing_fits(a) && routing_scratch_bytes(a.route.E) <= layout(a.d_model, 1).total);
}

int64_t moe_experts_fp8_mma_scratch_bytes(const MoeExpertsArgs& a) { return moe_scratch(a).total; }

cudaError_t launch_moe_experts_fp8_mma(const MoeExpertsArgs& a, void* scratch, cudaStream_t stream) {
  if (!moe_experts_fp8_mma_supports(a)) return cudaErrorInvalidValue;
  const tiles::MoeBuffers b = tiles::moe_buffers(moe_scratch(a), scratch, a.x);
  if (!b.x_images) return cudaErrorInvalidValue;
  cudaError_t status = prepare_moe(a.x, a.T, a.d_model, nullptr, 1, b.x_images, stream);
  if (status == cudaSuccess)
    status = launch_moe<kMoeGateUp>(a, a.gate, a.up, a.d_model, b.x_images, b.products, stream);
  if (status == cudaSuccess)
    status = prepare_moe(b.products, a.T, a.k * a.d_ff, a.weights, a.d_ff, b.act_images, stream);
  if (status == cudaSuccess)
    status = launch_moe<kMoeDown>(a, a.down, a.down, a.k * a.d_ff, b.act_images, a.out, stream);
  return status;
}

bool fp8_matvec_mma_supports(const Fp8WeightView& w, int64_t T) {
  return T >= 1 && T <= kMaxFp8MatvecTokens && w.block == kBlock && w.in % kBlock == 0 && w.in <= (1 << 20) &&
         w.out >= 1 && w.out <= (1 << 30) && reinterpret_cast<uintptr_t>(w.values) % 16 == 0 &&
         parts_for(w.in, T) > 0;
}

int64_t fp8_matvec_mma_scratch_bytes(const Fp8WeightView& w, int64_t T) {
  const int parts = fp8_matvec_mma_supports(w, T) ? parts_for(w.in, T) : 1;
  return parts * part_image_bytes(w.in / parts, T);
}

cudaError_t launch_fp8_matvec_mma(const MmaInput& input, const Fp8WeightView& w, const float* bias, float* y,
                                  int64_t T, void* scratch, cudaStream_t stream, bool accumulate) {
  using Kind = MmaInput::Kind;
  const bool splits_fit = input.kind != Kind::attention_splits ||
                          (input.split_max && input.split_sum && input.splits >= 1 &&
                           input.splits <= kMaxAttentionSplits && input.head_dim >= 4 && input.head_dim % 4 == 0 &&
                           w.in % input.head_dim == 0);
  if (!fp8_matvec_mma_supports(w, T) || !splits_fit || reinterpret_cast<uintptr_t>(input.x) % 16 ||
      reinterpret_cast<uintptr_t>(scratch) % 16)
    return cudaErrorInvalidValue;
  return mmas_for(int(T)) == 1 ? launch_for<1>(input, w, bias, y, T, scratch, accumulate, stream)
                               : launch_for<2>(input, w, bias, y, T, scratch, accumulate, stream);
}

cudaError_t launch_fp8_matvec_mma(const float* x, const Fp8WeightView& w, const float* bias, float* y, int64_t T,
                                  void* scratch, cudaStream_t stream) {
  return launch_fp8_matvec_mma(MmaInput{.x = x}, w, bias, y, T, scratch, stream, false);
}

}  // namespace mere::cuda
