// MLX affine decode matvecs (T <= 8 tokens) on the tensor cores: lever
// tensor_core_affine_matvec (affine_ops.cpp runs it from 2 tokens, and for one
// token of a large matrix).
//
// Why: the CUDA-core matvec (affine_matvec.cu) spends about three instructions
// per weight and token (unpack, convert, FMA), so int4 is bound by instructions
// at T = 1 and every T costs another pass of FMAs. Here a 16-row tile of codes
// is the mma's A operand and x its B operand, so T = 8 costs the weight reads
// of T = 1 plus one more mma per step.
//
// Exactness: a code c enters A as the f16 value kOffset + c (8 bits: 1024 + c,
// one byte permute for two codes; 4 bits: 16 + c, a shift and a mask). x enters
// B as two f16 halves, hi = f16(x') and lo = f16(x' - hi), x' = x 2^k with a
// power of two k per group and token that puts the group's largest |x'| in
// [2^14, 2^15) (22 significant bits, no overflow). hi and lo are two columns
// of B, so for T <= 4 one m16n8k16 mma sums both for all tokens. Per group and
// token, with S = sum(hi + lo) over the group (staged with x):
//   sum w x = 2^-k (scale (C_hi + C_lo - kOffset S) + bias S)
// in f32, C the mma's f32 sums.
//
// Shape: a first kernel converts x once into a scratch buffer, the image of
// what every block stages in shared memory: rows (t, hi|lo) of f16 in each
// group's order of the codes (4 bits: runs of 8 as 0 4 1 5 2 6 3 7, the pairs a
// shift and mask unpack), then {S, 2^-k} per token and group. Each matvec block
// copies it with cp.async (converting it in every block cost more than the
// weights of a small matrix at 8 tokens, and gained nothing at one). Each warp streams its 16-row tiles' codes, at least
// 128 contiguous bytes of each row a stage, with their scales and biases,
// through a ring of cp.async stages in shared memory (several KB in flight
// per warp, none in registers); `split` warps share a tile's stages and add
// their sums in a fixed order.
// Lane (g, q) = (lane / 4, lane % 4) owns rows g and g + 8 of a tile and the
// codes [q G / 4, (q + 1) G / 4) of each group G: mma step s takes 4 of them,
// whose x sit at the same place in the staged row, so the k order inside a
// group is the lanes', and each group's sums stay apart.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/affine_launchers.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kTileRows = 16;
constexpr int kRingBytes = 6 * 1024;  // per warp: weight stages in flight (at least 3 stages)
constexpr int kXPad = 8;              // halves after each staged row of x: 16-byte B loads without
                                      // bank conflicts (groups of 64)

template <int kBits, int kGroup, typename S>
struct Shape {
  static constexpr int kGroupBytes = kGroup * kBits / 8;
  // A stage takes at least 128 contiguous bytes (whole sectors, and fewer
  // stages) of each row of its tile, and at least two groups.
  static constexpr int kStageGroups = std::max(2, 128 / kGroupBytes);
  static constexpr int kStageValues = kStageGroups * kGroup;
  static constexpr int kRowBytes = kStageGroups * kGroupBytes;
  static constexpr int kLaneBytes = kGroupBytes / 4;  // a lane's codes of one group of a row
  static constexpr int kLaneWords = kLaneBytes / 4;
  // Padding after each staged row: one phase of the lanes' code loads (8, 4 or
  // 2 rows of 4 lanes for 4-, 8- and 16-byte loads) then hits every bank once.
  static constexpr int kRowStride = kRowBytes + (kLaneBytes >= 32 ? 16 : 4 * kLaneBytes);
  static constexpr int kCodeBytes = kTileRows * kRowStride;
  static constexpr int kScaleRowBytes = kStageGroups * int(sizeof(S));  // a row's scales (or biases) of a stage
  static constexpr int kScaleBytes = kTileRows * 2 * kScaleRowBytes;
  static constexpr int kStageBytes = (kCodeBytes + kScaleBytes + 15) / 16 * 16;
  static constexpr int kStages = std::max(3, kRingBytes / kStageBytes);
  static constexpr int kSteps = kGroup / 16;  // k16 steps per group
  static constexpr float kOffset = kBits == 8 ? 1024.0f : 16.0f;
};

struct Problem {
  const uint8_t* packed;
  const void* scales;
  const void* biases;
  const uint8_t* staged;  // x converted (prepare kernel): the image of a block's x and sums
  int x_stride;           // halves per staged row of x
  int64_t x_bytes, staged_bytes;  // the staged rows of x; with the sums after them
  const float* bias;
  float* y;
  int in, out, T;
  int n_groups;  // per row
  int split;     // warps per tile
  int n_units;   // units of kWarps / split tiles
};

// The converted x, and the start of a block's shared memory: rows (t, hi|lo)
// [2T][in + kXPad] f16, then {S, 2^-k} [T][n_groups]; then the warps' rings
// and their partial sums [kWarps][32] float4.
struct Layout {
  int x_stride;  // halves
  int64_t x_bytes, staged_bytes, ring_bytes, total;
};
Layout layout(int in, int n_groups, int T, int stage_bytes, int stages) {
  Layout l;
  l.x_stride = in + kXPad;
  l.x_bytes = int64_t(2) * T * l.x_stride * 2;  // a multiple of 16: in % 64 == 0
  l.staged_bytes = l.x_bytes + (int64_t(T) * n_groups * 8 + 15) / 16 * 16;
  l.ring_bytes = int64_t(kWarps) * stages * stage_bytes;
  l.total = l.staged_bytes + l.ring_bytes + kWarps * 32 * 16;
  return l;
}

// 4 or 8 bytes global -> shared (a row's scales or biases of a stage).
template <int kBytes>
__device__ __forceinline__ void copy_async_small(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(smem_address(dst)), "l"(src), "n"(kBytes)
               : "memory");
}

__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint2 b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}

// Two codes as the f16 pair (kOffset + c, kOffset + c') for A slots (2q, 2q+1)
// or (2q+8, 2q+9). 8 bits: codes 2i and 2i + 1 of the word. 4 bits: nibbles i
// and i + 4 (a shift puts them at bits 6-9 and 22-25, where the exponent of 16
// gives them a weight of 1).
template <int kBits>
__device__ __forceinline__ uint32_t code_pair(uint32_t word, int i) {
  if constexpr (kBits == 8) {
    return __byte_perm(word, 0x64u, i == 0 ? 0x4140 : 0x4342);
  } else {
    const uint32_t shifted = i == 0 ? word << 6 : i == 1 ? word << 2 : i == 2 ? word >> 2 : word >> 6;
    return (shifted & 0x03C003C0u) | 0x4C004C00u;
  }
}

__device__ __forceinline__ uint32_t f16x2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// One run of 8 values of x [T, in] (token t, values e to e + 8) into the
// staged image at `staged`: its hi and lo halves (4 bits: stored as 0 4 1 5 2 6 3 7), and with its
// group's other runs {S, 2^-k}. The G / 8 lanes of a group are consecutive
// lanes of one warp and all call this, those past the end with active false.
template <int kBits, int kGroup>
__device__ __forceinline__ void stage_run(const float* x, int in, int t, int e, bool active, int x_stride,
                                          uint8_t* staged, int64_t x_bytes) {
  constexpr int kLanes = kGroup / 8;
  const float4* src = reinterpret_cast<const float4*>(x + int64_t(t) * in + e);
  const float4 a = active ? __ldg(src) : make_float4(0, 0, 0, 0), b = active ? __ldg(src + 1) : a;
  float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  float amax = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
#pragma unroll
  for (int o = 1; o < kLanes; o *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  int exponent = 0;
  frexpf(amax, &exponent);  // amax in [2^(exponent-1), 2^exponent)
  const bool scaled = amax > 0 && amax <= 3.0e38f;
  exponent = max(exponent, -100);
  const float up = scaled ? ldexpf(1.0f, 15 - exponent) : 1.0f, down = scaled ? ldexpf(1.0f, exponent - 15) : 1.0f;
  float sum = 0;
  uint32_t hi[4], lo[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    // The pair (v[j0], v[j1]) in staged order: 8 bits in place, 4 bits (k, k + 4).
    const int j0 = kBits == 8 ? 2 * k : k, j1 = kBits == 8 ? 2 * k + 1 : k + 4;
    const float x0 = v[j0] * up, x1 = v[j1] * up;
    hi[k] = f16x2(x0, x1);
    const float2 h = __half22float2(*reinterpret_cast<const __half2*>(&hi[k]));
    lo[k] = f16x2(x0 - h.x, x1 - h.y);
    const float2 l = __half22float2(*reinterpret_cast<const __half2*>(&lo[k]));
    sum += (h.x + l.x) + (h.y + l.y);
  }
#pragma unroll
  for (int o = 1; o < kLanes; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (!active) return;
  uint8_t* row = staged + int64_t(2 * t) * x_stride * 2 + int64_t(e) * 2;
  *reinterpret_cast<uint4*>(row) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
  *reinterpret_cast<uint4*>(row + int64_t(x_stride) * 2) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  if (threadIdx.x % kLanes == 0)
    reinterpret_cast<float2*>(staged + x_bytes)[t * (in / kGroup) + e / kGroup] = make_float2(sum, down);
}

// x converted once into the scratch buffer, a thread a run.
template <int kBits, int kGroup>
__global__ void affine_mma_prepare_kernel(const float* x, int T, int in, int x_stride, uint8_t* staged,
                                          int64_t x_bytes) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int runs = in / 8, i = blockIdx.x * blockDim.x + threadIdx.x;  // T * runs is a multiple of G / 8
  if (i - int(threadIdx.x % 32) >= T * runs) return;                    // the whole warp is past the end
  const bool active = i < T * runs;
  const int t = active ? i / runs : 0, e = active ? 8 * (i - t * runs) : 0;
  stage_run<kBits, kGroup>(x, in, t, e, active, x_stride, staged, x_bytes);
}

template <int kWords>
__device__ __forceinline__ void load_words(uint32_t (&w)[kWords], const uint8_t* src) {
  if constexpr (kWords == 1) {
    w[0] = *reinterpret_cast<const uint32_t*>(src);
  } else if constexpr (kWords == 2) {
    const uint2 v = *reinterpret_cast<const uint2*>(src);
    w[0] = v.x, w[1] = v.y;
  } else {
#pragma unroll
    for (int k = 0; k < kWords / 4; ++k) {
      const uint4 v = reinterpret_cast<const uint4*>(src)[k];
      w[4 * k] = v.x, w[4 * k + 1] = v.y, w[4 * k + 2] = v.z, w[4 * k + 3] = v.w;
    }
  }
}

// Scale (or bias) i of a row's words of a stage, as f32.
template <typename S>
__device__ __forceinline__ float unpack_scale(const uint32_t* words, int i) {
  if constexpr (sizeof(S) == 4) {
    return __uint_as_float(words[i]);
  } else {
    const uint32_t w = words[i / 2];
    const unsigned short h = (unsigned short)(i % 2 ? w >> 16 : w & 0xffffu);
    if constexpr (std::is_same_v<S, __half>)
      return __half2float(__ushort_as_half(h));
    else
      return __uint_as_float(i % 2 ? w & 0xffff0000u : w << 16);
  }
}

// Block b takes units b, b + gridDim.x, ...; a unit is kWarps / split tiles of
// 16 rows, warp w its tile w / split and the share w % split of its stages.
template <int kBits, int kGroup, typename S, bool kTwoMma>
__global__ void __launch_bounds__(kWarps * 32)
    affine_matvec_mma_kernel(const __grid_constant__ Problem p) {
  using Sh = Shape<kBits, kGroup, S>;
  constexpr int kSg = Sh::kStageGroups;
  extern __shared__ __align__(16) uint8_t smem[];
  const __half* xs = reinterpret_cast<const __half*>(smem);
  const float2* sums = reinterpret_cast<const float2*>(smem + p.x_bytes);
  uint8_t* ring = smem + p.staged_bytes + int64_t(threadIdx.x / 32) * Sh::kStages * Sh::kStageBytes;
  float4* partial =
      reinterpret_cast<float4*>(smem + p.staged_bytes + int64_t(kWarps) * Sh::kStages * Sh::kStageBytes);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int tiles_per_unit = kWarps / p.split, part = warp % p.split;
  const int row_stages = p.n_groups / kSg;  // stages of a tile
  const int stage_begin = part * row_stages / p.split, stage_end = (part + 1) * row_stages / p.split;
  const int my_units = (p.n_units - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
  const int n_stages = my_units * (stage_end - stage_begin);
  const int64_t row_bytes = int64_t(p.in) * kBits / 8;
  constexpr int kChunks = Sh::kRowBytes / 16;        // 16-byte chunks of a stage's row
  constexpr int kCopies = kTileRows * kChunks / 32;  // of them per lane and stage
  constexpr int kSb = Sh::kScaleRowBytes;
  constexpr int kSbCopy = kSb < 16 ? kSb : 16;  // bytes per copy of a row's scales (or biases)

  // The stage to issue next: its tile's first row and its stage in the row,
  // advanced in order (no divisions in the loop).
  int issue_row0 = (int(blockIdx.x) * tiles_per_unit + warp / p.split) * kTileRows, issue_stage = stage_begin;
  const int unit_rows = int(gridDim.x) * tiles_per_unit * kTileRows;
  const uint8_t* copy_src[kCopies];  // per copy: its row's bytes of this tile
  const uint8_t* scale_src;          // this lane's row's scales (lanes 0-15) or biases (16-31)
  auto point_at_tile = [&]() {
#pragma unroll
    for (int u = 0; u < kCopies; ++u) {
      const int c = lane + 32 * u, row = min(issue_row0 + c / kChunks, p.out - 1);
      copy_src[u] = p.packed + row * row_bytes + (c % kChunks) * 16;
    }
    const int row = min(issue_row0 + lane % kTileRows, p.out - 1);
    scale_src = static_cast<const uint8_t*>(lane < kTileRows ? p.scales : p.biases) +
                int64_t(row) * p.n_groups * sizeof(S);
  };
  point_at_tile();
  int issue_slot = 0;
  auto issue = [&]() {
    uint8_t* slot = ring + issue_slot * Sh::kStageBytes;
#pragma unroll
    for (int u = 0; u < kCopies; ++u) {
      const int c = lane + 32 * u;
      copy_async_16(smem_address(slot + (c / kChunks) * Sh::kRowStride + (c % kChunks) * 16),
                    copy_src[u] + issue_stage * Sh::kRowBytes);
    }
    uint8_t* scale_dst = slot + Sh::kCodeBytes + (lane % kTileRows) * 2 * kSb + (lane / kTileRows) * kSb;
#pragma unroll
    for (int o = 0; o < kSb; o += kSbCopy)
      copy_async_small<kSbCopy>(scale_dst + o, scale_src + issue_stage * kSb + o);
    issue_slot = issue_slot + 1 == Sh::kStages ? 0 : issue_slot + 1;
    if (++issue_stage == stage_end) {
      issue_stage = stage_begin;
      issue_row0 += unit_rows;
      point_at_tile();
    }
  };

  // Weights never change during a forward: the first stages load before the wait.
#pragma unroll
  for (int i = 0; i < Sh::kStages - 1; ++i) {
    if (i < n_stages) issue();
    copy_async_commit();
  }
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t b = int64_t(threadIdx.x) * 16; b < p.staged_bytes; b += int64_t(blockDim.x) * 16)
    copy_async_16(smem_address(smem + b), p.staged + b);
  copy_async_commit();
  copy_async_wait<0>();
  __syncthreads();

  float acc[2][2] = {};  // [token q, 4 + q][row g, g + 8]
  const int t0 = min(q, p.T - 1), t1 = min(4 + q, p.T - 1);
  // B rows: column n = lane / 4 is token n / 2 (n / 2 + 4), half n % 2.
  const int col_t0 = min(g / 2, p.T - 1), col_t1 = min(4 + g / 2, p.T - 1);
  const __half* b_row0 = xs + (2 * col_t0 + g % 2) * p.x_stride + q * (kGroup / 4);
  const __half* b_row1 = xs + (2 * col_t1 + g % 2) * p.x_stride + q * (kGroup / 4);
  int row0 = (int(blockIdx.x) * tiles_per_unit + warp / p.split) * kTileRows, stage = stage_begin, slot_index = 0;

  for (int i = 0; i < n_stages; ++i) {
    if (i + Sh::kStages - 1 < n_stages) issue();
    copy_async_commit();
    copy_async_wait<Sh::kStages - 1>();
    __syncwarp();
    const uint8_t* slot = ring + slot_index * Sh::kStageBytes;
    slot_index = slot_index + 1 == Sh::kStages ? 0 : slot_index + 1;
    // Rows g and g + 8: the stage's scales, then its biases.
    uint32_t sb_top[2 * kSb / 4], sb_bottom[2 * kSb / 4];
    load_words(sb_top, slot + Sh::kCodeBytes + g * 2 * kSb);
    load_words(sb_bottom, slot + Sh::kCodeBytes + (g + 8) * 2 * kSb);
    float4 m0, m1;  // {S, 2^-k} of two groups, tokens t0 and t1
#pragma unroll
    for (int gi = 0; gi < kSg; ++gi) {
      const int group = stage * kSg + gi;
      if (gi % 2 == 0) {
        m0 = *reinterpret_cast<const float4*>(sums + t0 * p.n_groups + group);
        if constexpr (kTwoMma) m1 = *reinterpret_cast<const float4*>(sums + t1 * p.n_groups + group);
      }
      uint32_t top[Sh::kLaneWords], bottom[Sh::kLaneWords];  // rows g and g + 8
      const int at = gi * Sh::kGroupBytes + q * Sh::kLaneBytes;
      load_words(top, slot + g * Sh::kRowStride + at);
      load_words(bottom, slot + (g + 8) * Sh::kRowStride + at);
      // B for the group's steps: 8 halves (two steps) per 16-byte load.
      uint4 b0[Sh::kSteps / 2], b1[Sh::kSteps / 2];
#pragma unroll
      for (int k = 0; k < Sh::kSteps / 2; ++k) {
        b0[k] = *reinterpret_cast<const uint4*>(b_row0 + group * kGroup + 8 * k);
        if constexpr (kTwoMma) b1[k] = *reinterpret_cast<const uint4*>(b_row1 + group * kGroup + 8 * k);
      }
      float c0[4] = {}, c1[4] = {};
#pragma unroll
      for (int s = 0; s < Sh::kSteps; ++s) {
        uint32_t a[4];
        if constexpr (kBits == 8) {
          a[0] = code_pair<8>(top[s], 0), a[1] = code_pair<8>(bottom[s], 0);
          a[2] = code_pair<8>(top[s], 1), a[3] = code_pair<8>(bottom[s], 1);
        } else {
          const int n = 2 * (s % 2);
          a[0] = code_pair<4>(top[s / 2], n), a[1] = code_pair<4>(bottom[s / 2], n);
          a[2] = code_pair<4>(top[s / 2], n + 1), a[3] = code_pair<4>(bottom[s / 2], n + 1);
        }
        const uint4& v0 = b0[s / 2];
        mma(c0, a, s % 2 ? make_uint2(v0.z, v0.w) : make_uint2(v0.x, v0.y));
        if constexpr (kTwoMma) {
          const uint4& v1 = b1[s / 2];
          mma(c1, a, s % 2 ? make_uint2(v1.z, v1.w) : make_uint2(v1.x, v1.y));
        }
      }
      const float st = unpack_scale<S>(sb_top, gi), sb = unpack_scale<S>(sb_bottom, gi);
      const float bt = unpack_scale<S>(sb_top + kSb / 4, gi) - Sh::kOffset * st;
      const float bb = unpack_scale<S>(sb_bottom + kSb / 4, gi) - Sh::kOffset * sb;
      const float sum0 = gi % 2 ? m0.z : m0.x, down0 = gi % 2 ? m0.w : m0.y;
      acc[0][0] += down0 * fmaf(st, c0[0] + c0[1], bt * sum0);
      acc[0][1] += down0 * fmaf(sb, c0[2] + c0[3], bb * sum0);
      if constexpr (kTwoMma) {
        const float sum1 = gi % 2 ? m1.z : m1.x, down1 = gi % 2 ? m1.w : m1.y;
        acc[1][0] += down1 * fmaf(st, c1[0] + c1[1], bt * sum1);
        acc[1][1] += down1 * fmaf(sb, c1[2] + c1[3], bb * sum1);
      }
    }
    __syncwarp();  // the slot is refilled next iteration
    if (++stage != stage_end) continue;

    // The tile's last stage: the split warps' sums meet, in a fixed order.
    if (p.split > 1) {
      partial[warp * 32 + lane] = make_float4(acc[0][0], acc[0][1], acc[1][0], acc[1][1]);
      __syncthreads();
      if (part == 0)
        for (int w = warp + 1; w < warp + p.split; ++w) {
          const float4 o = partial[w * 32 + lane];
          acc[0][0] += o.x, acc[0][1] += o.y, acc[1][0] += o.z, acc[1][1] += o.w;
        }
      __syncthreads();
    }
    if (part == 0) {
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int t = 4 * u + q, row = row0 + g + 8 * r;
          if (t < p.T && row < p.out) p.y[int64_t(t) * p.out + row] = acc[u][r] + (p.bias ? p.bias[row] : 0.0f);
        }
    }
    acc[0][0] = acc[0][1] = acc[1][0] = acc[1][1] = 0;
    stage = stage_begin;
    row0 += unit_rows;
  }
  copy_async_wait<0>();
}

// ---- host side ----

int max_smem() {
  static const int bytes = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  return bytes;
}

template <int kBits, int kGroup, typename S, bool kTwoMma>
struct Variant {
  using Sh = Shape<kBits, kGroup, S>;
  static constexpr auto kernel = affine_matvec_mma_kernel<kBits, kGroup, S, kTwoMma>;

  static Layout layout_for(const AffineArgs& w, int64_t T) {
    return layout(int(w.in), int(w.in / kGroup), int(T), Sh::kStageBytes, Sh::kStages);
  }
  static int blocks_per_sm(int64_t smem) {
    static const cudaError_t raised =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem());
    (void)raised;
    int blocks = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kWarps * 32, size_t(smem));
    return blocks;
  }

  static cudaError_t launch(const AffineArgs& w, const float* x, const float* bias, float* y, int64_t T, void* scratch,
                            cudaStream_t stream) {
    const Layout l = layout_for(w, T);
    if (l.total > max_smem()) return cudaErrorInvalidValue;
    const int per_sm = blocks_per_sm(l.total);
    if (per_sm < 1) return cudaErrorInvalidValue;
    const int64_t slots = int64_t(per_sm) * sm_count();
    const int n_tiles = int((w.out + kTileRows - 1) / kTileRows), row_stages = int(w.in / Sh::kStageValues);
    // Split-K: the fewest warps per tile whose units fill the slots as well as
    // any, each warp keeping its ring full.
    int split = 1;
    double best = 0;
    for (int s = 1; s <= kWarps && row_stages / s >= 1; s *= 2) {
      const int64_t units = (n_tiles + kWarps / s - 1) / (kWarps / s);
      const double waves = double((units + slots - 1) / slots);
      const double fill = double(units) / (waves * double(slots));
      if (fill > best * 1.05 && (s == 1 || row_stages / s >= Sh::kStages - 1)) best = fill, split = s;
    }
    Problem p{};
    p.packed = reinterpret_cast<const uint8_t*>(w.packed);
    p.scales = w.scales;
    p.biases = w.biases;
    p.staged = static_cast<const uint8_t*>(scratch);
    p.x_stride = l.x_stride;
    p.x_bytes = l.x_bytes;
    p.staged_bytes = l.staged_bytes;
    p.bias = bias;
    p.y = y;
    p.in = int(w.in);
    p.out = int(w.out);
    p.T = int(T);
    p.n_groups = int(w.in / kGroup);
    p.split = split;
    p.n_units = (n_tiles + kWarps / split - 1) / (kWarps / split);
    const int threads = int(T * w.in / 8);
    const cudaError_t status =
        launch_kernel(affine_mma_prepare_kernel<kBits, kGroup>, dim3(ceil_div(threads, 256)), dim3(256), 0, stream,
                      x, int(T), int(w.in), l.x_stride, static_cast<uint8_t*>(scratch), l.x_bytes);
    if (status != cudaSuccess) return status;
    const int grid = int(std::min<int64_t>(p.n_units, slots));
    return launch_kernel(kernel, dim3(grid), dim3(kWarps * 32), size_t(l.total), stream, p);
  }
};

// Calls fn with the Variant for the weight's bits, group, scale type and T.
template <typename Fn>
cudaError_t visit_variant(const AffineArgs& w, int64_t T, Fn&& fn) {
  return visit_float(w.scale_dtype, [&]<typename S>() {
    auto by_group = [&]<int kBits, bool kTwo>() {
      if (w.group_size == 32) fn(Variant<kBits, 32, S, kTwo>{});
      else if (w.group_size == 64) fn(Variant<kBits, 64, S, kTwo>{});
      else fn(Variant<kBits, 128, S, kTwo>{});
    };
    const bool two = T > 4;
    if (w.bits == 4)
      two ? by_group.template operator()<4, true>() : by_group.template operator()<4, false>();
    else
      two ? by_group.template operator()<8, true>() : by_group.template operator()<8, false>();
  });
}

bool shape_supported(const AffineArgs& w, int64_t T) {
  if (T < 1 || T > 8 || (w.bits != 4 && w.bits != 8)) return false;
  if (w.group_size != 32 && w.group_size != 64 && w.group_size != 128) return false;
  if (w.in <= 0 || w.out <= 0 || w.in > (1 << 20) || w.out > (1 << 30)) return false;
  // A row is a whole number of stages (Shape: 128 bytes and two groups at least).
  const int64_t group_bytes = w.group_size * w.bits / 8, stage_groups = std::max<int64_t>(2, 128 / group_bytes);
  if (w.in % (stage_groups * w.group_size) != 0) return false;
  const int64_t scale_copy = std::min<int64_t>(16, stage_groups * (w.scale_dtype == DType::f32 ? 4 : 2));
  const auto aligned = [](const void* p, int64_t n) { return reinterpret_cast<uintptr_t>(p) % uintptr_t(n) == 0; };
  return aligned(w.packed, 16) && aligned(w.scales, scale_copy) && aligned(w.biases, scale_copy);
}

}  // namespace

bool affine_matvec_mma_supports(const AffineArgs& w, int64_t T) {
  if (!shape_supported(w, T)) return false;
  bool fits = false;
  visit_variant(w, T, [&](auto variant) { fits = decltype(variant)::layout_for(w, T).total <= max_smem(); });
  return fits;
}

int64_t affine_matvec_mma_scratch_bytes(const AffineArgs& w, int64_t T) {
  return layout(int(w.in), int(w.in / w.group_size), int(T), 0, 0).staged_bytes;
}

cudaError_t launch_affine_matvec_mma(const AffineArgs& w, const float* x, const float* bias, float* y, int64_t T,
                                     void* scratch, cudaStream_t stream) {
  if (!shape_supported(w, T) || reinterpret_cast<uintptr_t>(x) % 16 || reinterpret_cast<uintptr_t>(scratch) % 16)
    return cudaErrorInvalidValue;
  cudaError_t status = cudaSuccess;
  const cudaError_t dispatch =
      visit_variant(w, T, [&](auto variant) { status = decltype(variant)::launch(w, x, bias, y, T, scratch, stream); });
  return status != cudaSuccess ? status : dispatch;
}

}  // namespace mere::cuda
