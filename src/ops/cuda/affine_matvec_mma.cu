// MLX affine decode matvecs (T <= 8 tokens, 16 in two digits) on the tensor
// cores: lever tensor_core_affine_matvec (affine_ops.cpp runs it from 2 tokens,
// and for one token of a large matrix; 9-16 under lever sixteen_token_matvec).
//
// Why: the CUDA-core matvec (affine_matvec.cu) spends about three instructions
// per weight and token (unpack, convert, FMA), so int4 is bound by instructions
// at T = 1 and every T costs another pass of FMAs. Here a 16-row tile of codes
// is the A operand of an integer mma (m16n8k32, u8 codes times s8 digits of x,
// s32 sums) and x its B operand: 8-bit codes go in as they are stored, 4-bit
// ones after one mask (and a shift) per 8 codes, so T = 8 costs the weight
// reads of T = 1 plus two more mmas per step.
//
// Exactness: per group and token, x is scaled by a power of two 2^k that puts
// its largest |x| in [2^21, 2^22) and rounded to an integer x' (23 significant
// bits, as f32's 24), which is written as three signed base-256 digits,
// x' = d0 + 256 d1 + 65536 d2, each in [-128, 128). A token takes four
// columns of B, its three digits and one unused, so two tokens share an mma
// (T <= 2 takes one per step, T <= 4 two, T <= 8 four). The mma sums
// C = sum c d exactly in s32, and the lane holding a token's columns 0 and 1
// adds C0 + 256 C1 (|.| < 2^31) before its one conversion to f32, the lane
// holding column 2 converts C2: per group, in f32,
//   sum w x'' = scale 2^-k (C0 + 256 C1 + 65536 C2) + bias 2^-k sum x',
// x'' = x' 2^-k, the f32 product with x rounded to 23 bits (C0 + 256 C1 rounds
// to 24 bits, 2^-32 of the group's sum, below the f32 accumulation's rounding).
// The staged table holds 2^-k (or 2^-k 65536) and 2^-k sum x' per lane quad;
// quads of tokens past T hold zeros.
// Lever int4_byte_codes (the MoE experts' int4 g64 and g128 stacks): the
// stored bytes go into the mma as they are, b = lo + 16 hi for
// codes lo = c_2j and hi = c_2j+1, so no shift unpacks them. A step pair takes
// the bytes against y_j = x'_2j+1 and their low codes (one mask) against
// z_j = 16 x'_2j - x'_2j+1, which sums to 16 sum c x' exactly:
//   b y + lo z = lo x'_2j+1 + 16 hi x'_2j+1 + 16 lo x'_2j - lo x'_2j+1.
// y and z are 4 digits each (|z| < 17 2^22), a token's four columns, and the
// factors carry the 1/16 (kByteCodes below). Two mmas a 64-value group as
// before, 4 mask instructions a lane instead of 12 (masks and shifts). The
// dense one-token matvec in this form measured level (Llama-3-8B int4 -0.2%,
// docs/levers.md), so only the experts take it; the kernel supports both.
// Lever int16_activation_matvec (affine_ops.cpp: from 2 tokens): x' is rounded
// to 15 bits instead (largest |x'| in [2^13, 2^14)), two digits d0 + 256 d1,
// so a token takes two columns and four tokens share an mma (T <= 4 takes one
// per step, T <= 8 two): half the mmas, B loads and per-group sums from 3
// tokens on, and 2/3 of x's copy. Every lane quad then holds one token's two
// digits and writes its sums.
// Lever sixteen_token_matvec: 9-16 tokens in two digits, three or four mmas a
// step (batched decode of 9-16 sequences, which the prefill GEMM took before):
// the weights are read once for all of them, and x's image (16 tokens x 2
// digits: 128 KB at 4,096 columns) leaves one block an SM.
//
// Shape: a first kernel converts x once into a scratch buffer, the image of
// what every block stages in shared memory: digit rows (row 3t + d) of s8 in
// each group's order of the codes (4 bits: runs of 8 as 0 2 4 6 1 3 5 7, the
// order one mask and one shift unpack), then the per-column factors. Each
// matvec block copies it with cp.async (converting it in every block cost more
// than the weights of a small matrix at 8 tokens, and lost 8% of a Llama-3-8B
// decode at one). For the fused decode forms (lever fused_norm_matvec) that
// kernel also forms the input, RMSNorm(h) w, silu(gate) up or attention's
// split-K partials merged, and the matvec adds its product into y. Where x is
// too long for a block's shared memory with the rings (down_proj's 14336
// columns from 4 tokens), the row is cut into launches of whole stages, each
// adding its columns' product into y; the first kernel converts the whole row
// once, into one image per launch.
// The MoE experts' decode (lever tensor_core_moe_matvec, moe_launchers.h) runs
// the same kernel in two more modes, blockIdx.y picking the work: gate/up, a
// block row per (token, slot) pair over its expert's gate then up rows; down, a
// block row per token over its k experts' rows side by side, warp s of a tile
// on slot s (split = k). Their prepare kernels write one image per token.
// Each warp streams its 16-row tiles' codes, at least 128 contiguous bytes of
// each row a stage, with their scales and biases, through a ring of cp.async
// stages in shared memory (several KB in flight per warp, none in registers);
// `split` warps share a tile's stages and add their sums in a fixed order.
// Lane (g, q) = (lane / 4, lane % 4) owns rows g and g + 8 of a tile and the
// codes [q G / 4, (q + 1) G / 4) of each group G: mma step s takes 8 of them,
// whose x digits sit at the same place in the staged rows, so the k order
// inside a group is the lanes', and each group's sums stay apart.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/affine_launchers.h"
#include "ops/cuda/attention_split.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"
#include "ops/cuda/matvec_tiles.cuh"
#include "ops/cuda/moe_launchers.h"
#include "ops/cuda/moe_routing.cuh"
#include "ops/cuda/phase_probe.cuh"

namespace mere::cuda {
namespace {

using tiles::kDense;
using tiles::kMoeDown;
using tiles::kMoeGateUp;
using tiles::kTileRows;
using tiles::kWarps;
// Lever deep_moe_ring: the experts' ring at one token of int8 weights. Five
// stages (16 KB a warp at g64) leave gate/up one block an SM, where split-K
// then gives a tile 4 warps of 4 stages each instead of 2 of 8 (Qwen3-30B-A3B),
// a warp's share of a tile in flight at once (the sums regroup: f32 rounding);
// down has one block an SM either way. Its own kernels: a ring depth chosen
// inside the kernel cost 2-4% everywhere, and one kernel holding each depth's
// loop 6-20% (docs/benchmarks.md, twenty-fifth session).
bool deep_moe_ring = false;
// Lever deep_dense_ring: the same five stages for the dense matvec at one token
// of int8 weights, where its blocks an SM stay those of three stages (a long
// row's x leaves one block an SM either way: Llama-3-8B's down_proj; g128): a
// warp's share of a tile has more of its stages on the way from HBM
// (Llama-3-8B int8 decode +1%; int4 lost with a deeper ring: docs/benchmarks.md,
// twenty-fifth and thirty-second sessions).
bool deep_dense_ring = false;
bool streamed_weights = false;  // lever streamed_weights
// Lever wide_batch_stages: at 5-8 tokens of int8 (two digits of x), where x's
// image leaves one block an SM anyway, a stage takes 256 bytes of each row
// instead of 128: half the stages, so half the per-stage work (the wait, the
// copies' addresses, the scales' loads) for the same weights, and more of them
// in flight a warp (docs/benchmarks.md, thirty-fourth session: Llama-3-8B int8
// +3% at 5-8 tokens). Stages of 64 bytes, which let two blocks share an SM at
// 5-8 tokens of int4, measured 11-12% slower.
bool wide_batch_stages = false;
bool uneven_row_cuts = false;  // lever uneven_row_cuts (Variant::cut_for)
bool int4_byte_codes = false;  // lever int4_byte_codes (the header's comment)
constexpr int kDeepRingStages = 5;
constexpr int kRingBytes = 6 * 1024;  // per warp: weight stages in flight (at least 3 stages)
constexpr int kMaxParts = 8;          // launches a row may be cut into (x too long for shared memory)

// Bytes after each staged row (codes or digits) whose lanes load `lane_bytes`
// each at q lane_bytes: one phase of the loads (8, 4 or 2 rows of 4 lanes for
// 4-, 8- and 16-byte loads; 2 rows for two 16-byte loads) hits every bank once,
// given rows a multiple of 128 bytes long.
constexpr int row_pad(int lane_bytes) { return lane_bytes >= 32 ? 16 : 4 * lane_bytes; }

// A stage takes at least 128 contiguous bytes (whole sectors, and fewer
// stages) of each row of its tile, and at least two groups.
constexpr int stage_groups(int bits, int group, int row_bytes_at_least) {
  return std::max(2, row_bytes_at_least / (group * bits / 8));
}

// kRowBytesAtLeast: the contiguous bytes of each row a stage takes at least
// (256 under lever wide_batch_stages).
template <int kBits, int kGroup, typename S, int kRowBytesAtLeast = 128>
struct Shape {
  static constexpr int kGroupBytes = kGroup * kBits / 8;
  static constexpr int kStageGroups = stage_groups(kBits, kGroup, kRowBytesAtLeast);
  static constexpr int kStageValues = kStageGroups * kGroup;
  static constexpr int kRowBytes = kStageGroups * kGroupBytes;
  static constexpr int kLaneBytes = kGroupBytes / 4;  // a lane's codes of one group of a row
  static constexpr int kLaneWords = kLaneBytes / 4;
  static constexpr int kRowStride = kRowBytes + row_pad(kLaneBytes);
  static constexpr int kCodeBytes = kTileRows * kRowStride;
  static constexpr int kScaleRowBytes = kStageGroups * int(sizeof(S));  // a row's scales (or biases) of a stage
  static constexpr int kScaleBytes = kTileRows * 2 * kScaleRowBytes;
  static constexpr int kStageBytes = (kCodeBytes + kScaleBytes + 15) / 16 * 16;
  static constexpr int kStages = std::max(3, kRingBytes / kStageBytes);
  static constexpr int kSteps = kGroup / 32;  // k32 steps per group
};

// The digit count that names lever int4_byte_codes' form of x (y and z, four
// digits each, a token's four columns): kernels instantiated with it read int4
// codes as whole bytes.
constexpr int kByteCodes = 4;
// B columns a token takes: its digits, padded to a power of two (3 digits: 4).
__host__ __device__ constexpr int columns_per_token(int digits) { return digits == 3 ? 4 : digits; }
// mmas a k32 step: one per 8 B columns.
__host__ __device__ constexpr int mmas_for(int T, int digits) {
  const int tokens_per_mma = 8 / columns_per_token(digits);
  return (T + tokens_per_mma - 1) / tokens_per_mma;
}
// The largest |x'| of a group lies in [2^(top - 1), 2^top): 23 significant
// bits in three digits, 15 in two (the top digit then in [-64, 64]).
__host__ __device__ constexpr int top_bit(int digits) { return digits >= 3 ? 22 : 14; }
// The most tokens a launch takes: up to four mmas a step, so 8 in three digits
// (two tokens an mma) and 16 in two (four; 9-16 only under lever
// sixteen_token_matvec, affine_ops.cpp).
__host__ __device__ constexpr int max_tokens(int digits) {
  return digits == 2 ? kMaxTensorCoreMatvecTokens : kMaxMatvecTokens;
}

// One launch's share of the columns (all of them unless x is too long for
// shared memory: then launches of whole stages, each adding into y).
struct Problem {
  const uint8_t* packed;  // the launch's first column of row 0; rows row_bytes apart
  const void* scales;     // likewise; rows scale_stride apart
  const void* biases;
  int64_t row_bytes;      // a whole row's packed bytes
  int scale_stride;       // a whole row's groups
  const uint8_t* staged;  // x converted (prepare kernel): the image of a block's x and factors
  int x_stride;           // bytes per staged digit row
  int64_t x_bytes, staged_bytes;  // the staged digit rows; with the factors after them
  const float* bias;
  float* y;
  bool accumulate;  // y += the product (the residual add), else y =
  int in, out, T;  // in: the launch's columns
  int n_groups;     // of the launch's columns
  int split;        // warps per tile
  int n_units;      // units of kWarps / split tiles
  // Mixture of experts (kMode != kDense): blockIdx.y picks the token's image and
  // the experts' rows (moe_launchers.h). Gate/up: a block per (token, slot)
  // pair, rows [0, d_ff) from the gate stack at packed, [d_ff, 2 d_ff) from
  // the up stack; y [2][pairs][d_ff], gate then up. Down: a block per token,
  // one warp per slot (split = k) over its expert's rows, y [T][out].
  const int32_t* ids;  // [T, k]
  int k, d_ff, pairs;
  int64_t expert_stride;  // rows from one expert's first row to the next's
  const uint8_t* up_packed;
  const void *up_scales, *up_biases;
  int64_t image_bytes;    // one token's staged image
  bool streamed_weights;  // the weights' copies evict first from L2 (lever streamed_weights)
  // Gate/up under lever routing_in_experts (route.logits set): each block routes
  // its token before its wait, and column 0's blocks write their pair's choice.
  MoeRouteArgs route;
};

// The converted x, and the start of a block's shared memory: digit rows
// [digits T][in + pad] s8, then per group, mma and lane quad q the float2
// {w, b} of its C columns: 3 digits, for token t = 2 mma + q / 2, q even
// (digits 0 and 1) {2^-k, 2^-k sum x'}, q odd (digit 2) {2^-k 65536, 0};
// 2 digits, for token t = 4 mma + q, {2^-k, 2^-k sum x'}; then, from a
// multiple of kRingAlign, the warps' rings and their partial sums
// [kWarps][mmas][32] float2.
// The rings start on 32 bytes. Groups of 128 at one token (and the experts'
// images at every batch) left them 16 bytes off, which cost up to 10% of a
// decode (Llama-3-8B int4 g128 at one token, Qwen3-30B-A3B int4 g128 at eight;
// docs/benchmarks.md, twenty-sixth session): most likely each 32-byte sector
// of a row's copy then straddles two in shared memory.
constexpr int64_t kRingAlign = 32;
__host__ __device__ constexpr int64_t ring_offset(int64_t staged_bytes) {
  return (staged_bytes + kRingAlign - 1) / kRingAlign * kRingAlign;
}
struct Layout {
  int x_stride;  // bytes
  int64_t x_bytes, staged_bytes, ring_bytes, total;
};
Layout layout(int in, int group, int T, int digits, int stage_bytes, int stages) {
  const int mmas = mmas_for(T, digits);
  Layout l;
  l.x_stride = in + row_pad(group / 4);  // a multiple of 16: in % 128 == 0
  l.x_bytes = int64_t(digits) * T * l.x_stride;
  l.staged_bytes = l.x_bytes + int64_t(in / group) * mmas * 4 * 8;
  l.ring_bytes = int64_t(kWarps) * stages * stage_bytes;
  l.total = ring_offset(l.staged_bytes) + l.ring_bytes + int64_t(kWarps) * mmas * 32 * 8;
  return l;
}

// 4 to 16 bytes global -> shared address dst (a row's scales or biases of a stage).
// With `hinted`, the copy carries the L2 cache policy `policy` (lever streamed_weights).
template <int kBytes>
__device__ __forceinline__ void copy_async_small(uint32_t dst, const void* src, bool hinted, uint64_t policy) {
  if constexpr (kBytes == 16) {
    copy_async_16_hinted(dst, src, hinted, policy);
  } else if (hinted) {
    asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], %2, %3;" ::"r"(dst), "l"(src), "n"(kBytes),
                 "l"(policy)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(dst), "l"(src), "n"(kBytes) : "memory");
  }
}

// d += a b: a 16x32 tile of u8 codes, b 32x8 s8 digits, s32 sums. Not
// volatile: a pure function of its operands, which the compiler may schedule.
__device__ __forceinline__ void mma(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A group's factors of token t in the staged table: its lane quads' float2
// (two of them with 3 digits, one with 2).
template <int kDigits>
__device__ __forceinline__ float2* token_factors(uint8_t* staged, int64_t x_bytes, int group, int mmas, int t) {
  constexpr int kTokens = 8 / columns_per_token(kDigits);  // a mma's
  return reinterpret_cast<float2*>(staged + x_bytes) + (int64_t(group) * mmas + t / kTokens) * 4 +
         t % kTokens * (4 / kTokens);
}

// The four digit bytes of each of four words, as four digit words: word d
// holds digit d of b[0..3].
__device__ __forceinline__ void transpose_digits(const uint32_t* b, uint32_t (&digits)[4]) {
  const uint32_t low01 = __byte_perm(b[0], b[1], 0x5140), low23 = __byte_perm(b[2], b[3], 0x5140);
  const uint32_t high01 = __byte_perm(b[0], b[1], 0x7362), high23 = __byte_perm(b[2], b[3], 0x7362);
  digits[0] = __byte_perm(low01, low23, 0x5410);
  digits[1] = __byte_perm(low01, low23, 0x7632);
  digits[2] = __byte_perm(high01, high23, 0x5410);
  digits[3] = __byte_perm(high01, high23, 0x7632);
}

// Lever int4_byte_codes' staging of a run of 8 values (4 stored bytes, j = 0..3):
// y_j = x'_2j+1 and z_j = 16 x'_2j - x'_2j+1 in 4 digits each. In a group's digit
// row, lane q's 8-byte runs of codes (bytes 8 p + 0..7 of its G / 8, mma pair p)
// have 16 bytes at q G / 4 + 16 p: y of the 8 bytes, then z of them, the B
// words of steps 2 p and 2 p + 1.
template <int kGroup>
__device__ __forceinline__ void stage_byte_coded(const float (&v)[8], float up, bool finite, int T, int t, int e,
                                                 bool active, int x_stride, uint8_t* staged, int64_t x_bytes,
                                                 float down) {
  constexpr int kLanes = kGroup / 8;
  int sum = 0;
  uint32_t y_bytes[4], z_bytes[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int lo = finite ? __float2int_rn(v[2 * j] * up) : 0, hi = finite ? __float2int_rn(v[2 * j + 1] * up) : 0;
    sum += lo + hi;
    // Balanced base-256 digits: z + 0x80808080 holds each digit plus 128 in its
    // own byte (|z| < 17 2^22), and the xor makes them signed.
    y_bytes[j] = (uint32_t(hi) + 0x80808080u) ^ 0x80808080u;
    z_bytes[j] = (uint32_t(16 * lo - hi) + 0x80808080u) ^ 0x80808080u;
  }
  uint32_t y[4], z[4];
  transpose_digits(y_bytes, y);
  transpose_digits(z_bytes, z);
#pragma unroll
  for (int o = 1; o < kLanes; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (!active) return;
  const int in_group = e % kGroup, byte0 = in_group / 2;  // the run's first stored byte in its group
  constexpr int kLaneBytes = kGroup / 8;
  const int q = byte0 / kLaneBytes, o = byte0 % kLaneBytes;
  const int at = e - in_group + q * (kGroup / 4) + 16 * (o / 8) + o % 8;
#pragma unroll
  for (int d = 0; d < kByteCodes; ++d) {
    uint8_t* row = staged + int64_t(kByteCodes * t + d) * x_stride + at;
    *reinterpret_cast<uint32_t*>(row) = y[d];
    *reinterpret_cast<uint32_t*>(row + 8) = z[d];
  }
  if (threadIdx.x % kLanes != 0) return;
  const int group = e / kGroup, mmas = mmas_for(T, kByteCodes);
  float2* f = token_factors<kByteCodes>(staged, x_bytes, group, mmas, t);
  f[0] = make_float2(down * 0.0625f, float(sum) * down);  // (C0 + 256 C1) / 16, and the bias term
  f[1] = make_float2(down * 4096.0f, 0.0f);               // 65536 (C2 + 256 C3) / 16
  if (t != 0) return;
  for (int u = T; u < mmas * 2; ++u) {  // tokens past T in the last mma
    float2* past = token_factors<kByteCodes>(staged, x_bytes, group, mmas, u);
    past[0] = past[1] = make_float2(0.0f, 0.0f);
  }
}

// Eight values of x (token t, columns e to e + 8) into the staged image: their
// digits (4 bits: stored as 0 2 4 6 1 3 5 7) and, with the group's other runs,
// its factors. The G / 8 lanes of a group are consecutive lanes of one warp
// and all call this, those past the end with active false.
template <int kBits, int kGroup, int kDigits>
__device__ __forceinline__ void stage_values(const float (&v)[8], int T, int t, int e, bool active, int x_stride,
                                             uint8_t* staged, int64_t x_bytes) {
  constexpr int kLanes = kGroup / 8;
  float amax = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) amax = fmaxf(amax, isfinite(v[j]) ? fabsf(v[j]) : INFINITY);  // NaN counts as inf
#pragma unroll
  for (int o = 1; o < kLanes; o *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const bool finite = amax <= 3.4e38f;
  // amax in [2^(exponent-1), 2^exponent)
  const int exponent = amax > 0 && finite ? max(frexp_exponent(amax), -100) : 0;
  constexpr int kTop = top_bit(kDigits);
  const float up = exp2_int(kTop - exponent);
  // A group holding inf or NaN gives NaN rows, as the f32 product would give inf or NaN.
  const float down = finite ? exp2_int(exponent - kTop) : __int_as_float(0x7fc00000);
  if constexpr (kDigits == kByteCodes) {
    static_assert(kBits == 4 && kGroup >= 64, "byte codes: int4, a lane's 8-byte runs of a group");
    stage_byte_coded<kGroup>(v, up, finite, T, t, e, active, x_stride, staged, x_bytes, down);
  } else {
    int sum = 0;
    // Byte d of position k's word is its digit d: the digits below the top are
    // in [-128, 128) and the top one in [-64, 64], so x' + 0x808080 holds each
    // digit plus 128 in its own byte (no carries), and the xor makes them signed.
    uint32_t digit_bytes[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      // Staged position k holds value j: 8 bits in place, 4 bits 0 2 4 6 1 3 5 7.
      const int j = kBits == 8 ? k : (k < 4 ? 2 * k : 2 * (k - 4) + 1);
      const int xq = finite ? __float2int_rn(v[j] * up) : 0;  // |xq| <= 2^kTop
      sum += xq;
      digit_bytes[k] = (uint32_t(xq) + 0x808080u) ^ 0x808080u;
    }
    // Digit d's row takes byte d of positions 4 h .. 4 h + 3 (word h).
    uint32_t digits[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) transpose_digits(digit_bytes + 4 * h, digits[h]);
#pragma unroll
    for (int o = 1; o < kLanes; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (!active) return;
#pragma unroll
    for (int d = 0; d < kDigits; ++d)
      *reinterpret_cast<uint2*>(staged + int64_t(kDigits * t + d) * x_stride + e) = make_uint2(digits[0][d], digits[1][d]);
    if (threadIdx.x % kLanes != 0) return;
    const int group = e / kGroup, mmas = mmas_for(T, kDigits);
    constexpr int kQuads = 4 / (8 / columns_per_token(kDigits));  // a token's lane quads
    float2* f = token_factors<kDigits>(staged, x_bytes, group, mmas, t);
    f[0] = make_float2(down, float(sum) * down);                // C0 + 256 C1, and the bias term
    if constexpr (kQuads == 2) f[1] = make_float2(down * 65536.0f, 0.0f);  // C2
    if (t != 0) return;
    for (int u = T; u < mmas * 8 / columns_per_token(kDigits); ++u) {  // tokens past T in the last mma
      float2* past = token_factors<kDigits>(staged, x_bytes, group, mmas, u);
#pragma unroll
      for (int k = 0; k < kQuads; ++k) past[k] = make_float2(0.0f, 0.0f);
    }
  }
}

// One launch converts the whole row. A row cut into launches (x too long for
// shared memory) has one image per launch's columns, part_bytes apart.
struct Prepare {
  // [T, full]; kRmsNormed: h [T, full]; kSiluGated: gate_up [T, 2 full];
  // kAttentionSplits: the partial outputs [T, heads, splits, head_dim]
  const float* x;
  const void* norm_w;
  float eps;
  int full;                // the row's length
  int T, part, x_stride;   // part: the columns of one matvec launch (all of them unless the row is cut)
  uint8_t* staged;         // the image of part k at staged + k part_bytes
  int64_t x_bytes, part_bytes;
  const float *split_max, *split_sum;  // kAttentionSplits: [T, heads, splits]
  int splits, head_dim;
  int live_splits;  // kAttentionSplits: the splits read, the first ones (the rest are empty)
  // kSiluGated for the experts' down: input column e is scaled by the routing
  // weight pair_weights[e / pair_cols] of its (token, slot) pair.
  const float* pair_weights;
  int pair_cols;
  // The next kernel may start only after this one's wait, so that it can read
  // what the kernel before this one wrote (the routing's ids) before its own.
  bool allow_after_wait;
  // kRmsNormed for the experts: token t's image at staged + t part_bytes.
  bool image_per_token;
  // The input was final when this kernel started (the kernel before it let it
  // start only after its own wait), so the image is formed before the wait.
  bool input_final;
};

// Column e of the row: its part's image, and its column there.
__device__ __forceinline__ uint8_t* part_image(const Prepare& p, int e, int& e_in_part) {
  const int k = e / p.part;
  e_in_part = e - k * p.part;
  return p.staged + k * p.part_bytes;
}

// Eight values of the input at token t, columns e to e + 8: x (or h, which the
// RMSNorm branch of the kernel below normalizes), or silu(gate) up as
// silu_mul_halves computes it.
template <int kKind>
__device__ __forceinline__ void load_input(const Prepare& p, int t, int e, bool active, float (&v)[8]) {
  using Kind = AffineMmaInput::Kind;
  const float* row = p.x + int64_t(t) * p.full * (kKind == int(Kind::silu_gated) ? 2 : 1);
  const float4* src = reinterpret_cast<const float4*>(row + e);
  const float4 a = active ? __ldg(src) : make_float4(0, 0, 0, 0), b = active ? __ldg(src + 1) : a;
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  if constexpr (kKind == int(Kind::silu_gated)) {
    const float4* up = reinterpret_cast<const float4*>(row + p.full + e);
    const float4 c = active ? __ldg(up) : make_float4(0, 0, 0, 0), d = active ? __ldg(up + 1) : c;
    const float u[8] = {c.x, c.y, c.z, c.w, d.x, d.y, d.z, d.w};
    const float w = p.pair_weights ? __ldg(p.pair_weights + e / p.pair_cols) : 1.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = v[j] / (1.0f + __expf(-v[j])) * u[j] * w;
  }
}

// The staging of affine_mma_prepare_kernel below, after its wait or, where
// its input was final when it started (Prepare::input_final), before it.
template <int kBits, int kGroup, int kDigits, int kKind>
__device__ __forceinline__ void form_image(const Prepare& p, const float (&weight)[8]) {
  const int runs = p.full / 8, lane = threadIdx.x % 32;
  // The thread's run: of all tokens' runs, or (kRmsNormed) of token blockIdx.y's.
  // T * runs and runs are multiples of G / 8.
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if constexpr (kKind != int(AffineMmaInput::Kind::rms_normed)) {
    if (r - lane >= p.T * runs) return;  // the whole warp is past the end
    const bool active = r < p.T * runs;
    const int t = active ? r / runs : 0, e = active ? 8 * (r - t * runs) : 0;
    float v[8];
    load_input<kKind>(p, t, e, active, v);
    int e_in_part = 0;
    uint8_t* staged = part_image(p, e, e_in_part);
    stage_values<kBits, kGroup, kDigits>(v, p.T, t, e_in_part, active, p.x_stride, staged, p.x_bytes);
  } else {
    const int t = blockIdx.y;
    // The thread's own run of h is read first, with the loads of the sum of
    // squares, so that none waits after the reduction.
    const bool active = r < runs;
    const int e = active ? 8 * r : 0;
    float v[8];
    load_input<int(AffineMmaInput::Kind::plain)>(p, t, e, active, v);
    const float4* row = reinterpret_cast<const float4*>(p.x + int64_t(t) * p.full);
    // The thread's runs of the row, all loads issued before the first add (one
    // round trip to L2 for rows up to kRunsAtOnce blocks of runs), then summed
    // in the order of the runs.
    constexpr int kRunsAtOnce = 8;
    float4 held[kRunsAtOnce][2];
#pragma unroll
    for (int k = 0; k < kRunsAtOnce; ++k) {
      const int s = threadIdx.x + k * blockDim.x;
      held[k][0] = s < runs ? row[2 * s] : make_float4(0, 0, 0, 0);
      held[k][1] = s < runs ? row[2 * s + 1] : make_float4(0, 0, 0, 0);
    }
    float sum = 0;
    auto add_run = [&sum](const float4& a, const float4& b) {
      sum += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
    };
#pragma unroll
    for (int k = 0; k < kRunsAtOnce; ++k)
      if (threadIdx.x + k * blockDim.x < runs) add_run(held[k][0], held[k][1]);
    for (int s = threadIdx.x + kRunsAtOnce * blockDim.x; s < runs; s += blockDim.x) add_run(row[2 * s], row[2 * s + 1]);
    __shared__ float partial[32];
    sum = warp_sum(sum);
    if (lane == 0) partial[threadIdx.x / 32] = sum;
    __syncthreads();
    float total = 0;
    for (int w = 0; w < int(blockDim.x) / 32; ++w) total += partial[w];
    const float inv = rsqrtf(total / float(p.full) + p.eps);
    if (r - lane >= runs) return;  // the whole warp is past the end
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = weight[j] * (v[j] * inv);  // RMSNorm(h) w, as rms_norm
    int e_in_part = e;
    uint8_t* staged = p.image_per_token ? p.staged + t * p.part_bytes : part_image(p, e, e_in_part);
    stage_values<kBits, kGroup, kDigits>(v, p.image_per_token ? 1 : p.T, p.image_per_token ? 0 : t, e_in_part,
                                         active, p.x_stride, staged, p.x_bytes);
  }
}

// The input [T, full] into the staged images, a thread a run of 8 values.
// Plain x and kSiluGated: runs of all tokens over blocks of 256 threads.
// kRmsNormed: blocks (b, t) take token t's runs from 256 b, each first summing
// the squares of the whole row (f32, in the same order in every block) for
// RMSNorm: one block a token left the other SMs idle at one token.
template <int kBits, int kGroup, int kDigits, int kKind, typename N>
__global__ void affine_mma_prepare_kernel(const __grid_constant__ Prepare p) {
  if (!p.allow_after_wait) allow_next_kernel();
  const int runs = p.full / 8;
  const int r = blockIdx.x * blockDim.x + threadIdx.x;  // the thread's run
  // RMSNorm: the thread's norm weights never change in a forward, so they are
  // read before the wait (as rms_norm_kernel's are). Read after it, they cost
  // a trip to memory that the next matvec's early weight loads keep busy
  // (Llama-3-8B int4 decode 5% slower, docs/benchmarks.md).
  float weight[8];
  if constexpr (kKind == int(AffineMmaInput::Kind::rms_normed)) {
    const N* norm_w = static_cast<const N*>(p.norm_w) + (r < runs ? 8 * r : 0);
#pragma unroll
    for (int j = 0; j < 8; ++j) weight[j] = r < runs ? to_float(norm_w[j]) : 0.0f;
  }
  auto wait = [&] {
    wait_for_previous_kernel();
    if (p.allow_after_wait) allow_next_kernel();
  };
  if (!p.input_final) wait();
  form_image<kBits, kGroup, kDigits, kKind>(p, weight);
  if (p.input_final) wait();  // every thread: this kernel ends after the one before it
}

// Attention's split-K partials merged into o_proj's input (kAttentionSplits),
// with attention_merge_kernel's formula (its sums in another order, so the
// bits may differ from the unfused path's): a block takes 32 runs of 8 columns
// (each within one head) and one warp per 8 splits, warp w of W the splits w,
// w + W, ... of all 32 runs, a lane a run, with every load issued at once. The
// warps' maxima, sums and outputs then meet in warp order, and warp 0 stages
// the merged runs.
constexpr int kSplitsPerWarp = kSplitsPerMergeWarp;
constexpr int kMaxSplitWarps = kMaxAttentionSplits / kSplitsPerWarp;

template <int kBits, int kGroup, int kDigits>
__global__ void __launch_bounds__(kMaxSplitWarps * 32)
    affine_mma_prepare_splits_kernel(const __grid_constant__ Prepare p) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32, runs = p.full / 8;
  const int i = blockIdx.x * 32 + lane;  // the lane's run; T * runs is a multiple of G / 8
  const bool active = i < p.T * runs;
  const int t = active ? i / runs : 0, e = active ? 8 * (i - t * runs) : 0;
  const int head = e / p.head_dim, d = e - head * p.head_dim;
  const int64_t base = (int64_t(t) * (p.full / p.head_dim) + head) * p.splits;

  float ms[kSplitsPerWarp], ls[kSplitsPerWarp], os[kSplitsPerWarp][8];
#pragma unroll
  for (int k = 0; k < kSplitsPerWarp; ++k) {
    const int s = warp + k * warps;
    const bool used = active && s < p.live_splits;
    ms[k] = used ? __ldg(p.split_max + base + s) : -INFINITY;
    ls[k] = used ? __ldg(p.split_sum + base + s) : 0.0f;
    const float4* o = reinterpret_cast<const float4*>(p.x + (base + s) * p.head_dim + d);
    const float4 a = used ? __ldg(o) : make_float4(0, 0, 0, 0), b = used ? __ldg(o + 1) : a;
    os[k][0] = a.x, os[k][1] = a.y, os[k][2] = a.z, os[k][3] = a.w;
    os[k][4] = b.x, os[k][5] = b.y, os[k][6] = b.z, os[k][7] = b.w;
  }
  float v[8];
  if (!merge_split_partials<8, kMaxSplitWarps>(ms, ls, os, v)) return;
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = active ? v[j] : 0.0f;
  int e_in_part = 0;
  uint8_t* staged = part_image(p, e, e_in_part);
  stage_values<kBits, kGroup, kDigits>(v, p.T, t, e_in_part, active, p.x_stride, staged, p.x_bytes);
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
    if constexpr (std::is_same_v<S, __half>)
      return __half2float(__ushort_as_half((unsigned short)(i % 2 ? w >> 16 : w & 0xffffu)));
    else
      return __uint_as_float(i % 2 ? w & 0xffff0000u : w << 16);
  }
}

// The blocks an SM each kernel is built for, which sets ptxas's register
// budget: without it ptxas aimed at about 80 registers and spilled in the int8
// MoE gate/up kernel's loop (Qwen3-30B-A3B int8 decode 2.3% slower). Two (up
// to 128 registers) fit every kernel of 1-2 mmas a step without a spill and
// measured faster throughout (docs/benchmarks.md, twenty-fourth session);
// 3-4 mmas a step take up to 159 registers, and x's copy leaves them one block
// an SM anyway.
template <int kMmas>
constexpr int kMinBlocksPerSm = kMmas <= 2 ? 2 : 1;

// Block b takes units b, b + gridDim.x, ...; a unit is kWarps / split tiles of
// 16 rows, warp w its tile w / split and the share w % split of its stages.
template <int kBits, int kGroup, typename S, int kMmas, int kDigits, int kMode, int kStages, int kRowBytesAtLeast,
          bool kWarpRouted = false>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocksPerSm<kMmas>)
    affine_matvec_mma_kernel(const __grid_constant__ Problem p) {
  using Sh = Shape<kBits, kGroup, S, kRowBytesAtLeast>;
  // 3 digits: lane quads q and q + 1 hold token 2 m + q / 2, q even its digits
  // 0 and 1, q odd digit 2 (and an unused column); byte codes likewise, q odd
  // digits 2 and 3; 2 digits: quad q holds token 4 m + q, both digits.
  constexpr bool kPairedQuads = kDigits >= 3;
  static_assert(kDigits != kByteCodes || (kBits == 4 && kGroup >= 64), "byte codes: int4 g64 and g128");
  auto token_of = [](int m, int quad) { return kPairedQuads ? 2 * m + quad / 2 : 4 * m + quad; };
  constexpr int kSg = Sh::kStageGroups;
  extern __shared__ __align__(16) uint8_t smem[];
  const float2* factors = reinterpret_cast<const float2*>(smem + p.x_bytes);
  uint8_t* rings = smem + ring_offset(p.staged_bytes);
  uint8_t* ring = rings + int64_t(threadIdx.x / 32) * kStages * Sh::kStageBytes;
  float2* partial = reinterpret_cast<float2*>(rings + int64_t(kWarps) * kStages * Sh::kStageBytes);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int tiles_per_unit = kWarps / p.split, part = warp % p.split;
  const int row_stages = p.n_groups / kSg;  // stages of a tile
  const int stage_begin = part * row_stages / p.split, stage_end = (part + 1) * row_stages / p.split;
  const int my_units = (p.n_units - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
  const int n_stages = my_units * (stage_end - stage_begin);
  const int64_t row_bytes = p.row_bytes;
  constexpr int kChunks = Sh::kRowBytes / 16;  // 16-byte chunks of a stage's row
  static_assert(32 % kChunks == 0, "a round of the lanes' copies covers whole rows");
  static_assert(!kWarpRouted || kStages * Sh::kStageBytes >= kWarpRoutingBytes, "a warp routes in its own ring");
  constexpr int kCopies = kTileRows * kChunks / 32;  // of them per lane and stage
  constexpr int kCopyRows = 32 / kChunks;            // rows a round of copies covers
  constexpr int kSb = Sh::kScaleRowBytes;
  constexpr int kSbCopy = kSb < 16 ? kSb : 16;  // bytes per copy of a row's scales (or biases)

  // cmake -DMERE_PHASE_PROBE=ON: the experts' gate/up blocks' phases (phase_probe.cuh).
  constexpr bool kMarks = kMode == kMoeGateUp;
  if constexpr (kMarks) PHASE_MARK(0);
  // Mixture of experts: the block's token and its expert's rows (up rows from d_ff on).
  const tiles::MoeBlock moe = kMode == kMoeGateUp && p.route.logits
                                  ? routed_block<kWarpRouted>(p, smem, ring)
                                  : tiles::moe_block<kMode>(p.ids, p.k, p.expert_stride, part);
  const int token = moe.token, slot = moe.slot;
  const int64_t expert_row0 = moe.expert_row0, up_row0 = expert_row0 - p.d_ff;
  // Row `row`'s codes, and its scales (or biases) pointer, as the tile's copies take them.
  auto codes_of = [&](int row) -> const uint8_t* {
    if constexpr (kMode == kMoeGateUp)
      if (row >= p.d_ff) return p.up_packed + (up_row0 + row) * row_bytes;
    return p.packed + (expert_row0 + row - slot) * row_bytes;
  };
  auto scales_of = [&](int row, bool biases) -> const uint8_t* {
    if constexpr (kMode == kMoeGateUp)
      if (row >= p.d_ff)
        return static_cast<const uint8_t*>(biases ? p.up_biases : p.up_scales) +
               (up_row0 + row) * p.scale_stride * int64_t(sizeof(S));
    return static_cast<const uint8_t*>(biases ? p.biases : p.scales) +
           (expert_row0 + row - slot) * p.scale_stride * int64_t(sizeof(S));
  };

  // Copy u of a lane takes chunk lane % kChunks of row lane / kChunks + u kCopyRows;
  // lanes 0-15 copy row lane's scales, 16-31 row lane - 16's biases. Shared
  // addresses are kept as offsets so that the copies take them as immediates.
  const uint32_t ring_addr = smem_address(ring), ring_end = ring_addr + kStages * Sh::kStageBytes;
  const uint32_t copy_dst = (lane / kChunks) * Sh::kRowStride + (lane % kChunks) * 16;
  const uint32_t scale_dst = Sh::kCodeBytes + (lane % kTileRows) * 2 * kSb + (lane / kTileRows) * kSb;
  // The stage to issue next: its tile's first row and its stage in the row,
  // advanced in order (no divisions in the loop).
  int issue_row0 = (int(blockIdx.x) * tiles_per_unit + warp / p.split) * kTileRows, issue_stage = stage_begin;
  const int unit_rows = int(gridDim.x) * tiles_per_unit * kTileRows;
  const uint8_t* copy_src[kCopies];  // per copy: its row's bytes of this tile
  const uint8_t* scale_src;          // this lane's row's scales (lanes 0-15) or biases (16-31)
  auto point_at_tile = [&]() {
#pragma unroll
    for (int u = 0; u < kCopies; ++u) {
      const int row = min(issue_row0 + lane / kChunks + u * kCopyRows, p.out - 1);
      copy_src[u] = codes_of(row) + (lane % kChunks) * 16;
    }
    scale_src = scales_of(min(issue_row0 + lane % kTileRows, p.out - 1), lane >= kTileRows);
  };
  point_at_tile();
  uint32_t issue_addr = ring_addr;
  // Lever streamed_weights: the weights pass through L2 once a token, so they go
  // first. Off, the copies carry no hint (an explicit evict-normal one measured
  // 3-8% slower than none).
  const bool hinted = p.streamed_weights;
  const uint64_t evict_first = l2_evict_first();
  auto issue = [&]() {
    const int code_at = issue_stage * Sh::kRowBytes;
#pragma unroll
    for (int u = 0; u < kCopies; ++u)
      copy_async_16_hinted(issue_addr + copy_dst + u * kCopyRows * Sh::kRowStride, copy_src[u] + code_at, hinted,
                           evict_first);
#pragma unroll
    for (int o = 0; o < kSb; o += kSbCopy)
      copy_async_small<kSbCopy>(issue_addr + scale_dst + o, scale_src + issue_stage * kSb + o, hinted, evict_first);
    issue_addr += Sh::kStageBytes;
    if (issue_addr == ring_end) issue_addr = ring_addr;
    if (++issue_stage == stage_end) {
      issue_stage = stage_begin;
      issue_row0 += unit_rows;
      point_at_tile();
    }
  };

  // Dense matvecs issue their whole ring before the wait, each iteration
  // refilling the slot it has just used; the experts' keep one slot back.
  constexpr bool kWholeRing = kMode == kDense;
  if constexpr (kMarks) PHASE_MARK(3);
  tiles::issue_first_stages<kWholeRing ? kStages + 1 : kStages>(issue, n_stages);
  allow_next_kernel();
  wait_for_previous_kernel();
  if constexpr (kMarks) PHASE_MARK(4);
  // What a writing lane (part 0, q even with 3 digits, a token below T) adds its rows' sums
  // to: y itself when accumulating (the residual), and the bias. They are read
  // here, once y is final, and for the next tile right after each write, so
  // that no read waits at the end of a tile.
  float prior[kMmas][2], bias[2];
  auto read_tile_addends = [&](int first_row) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row + g + 8 * h;
      bias[h] = p.bias && row < p.out && part == 0 ? p.bias[row] : 0.0f;
#pragma unroll
      for (int m = 0; m < kMmas; ++m) {
        const int t = token_of(m, q);
        const bool writes = part == 0 && (!kPairedQuads || q % 2 == 0) && t < p.T && row < p.out;
        // Down's block writes its token's row (tiles::output_row), one image a block.
        const int64_t y_row = kMode == kMoeDown ? token : t;
        prior[m][h] = p.accumulate && writes ? p.y[y_row * p.out + row] : 0.0f;
      }
    }
  };
  read_tile_addends((int(blockIdx.x) * tiles_per_unit + warp / p.split) * kTileRows);
  tiles::load_staged_x(smem, p.staged + token * p.image_bytes, p.staged_bytes);
  if constexpr (kMarks) PHASE_MARK(5);

  float acc[kMmas][2] = {};  // per mma: rows g and g + 8 of the lane's columns
  // B: lane g loads column 8 m + g, digit g % 4 of token 2 m + g / 4 (3
  // digits) or digit g % 2 of token 4 m + g / 2 (2 digits), its digits at
  // q G / 4 of each group. Column 3 of a token (3 digits) and the tokens past T
  // load a digit row in use: the former is weighted 0 (`high`), the latter have
  // zero factors.
  const uint8_t* b_row[kMmas];
#pragma unroll
  for (int m = 0; m < kMmas; ++m) {
    constexpr int kColumns = columns_per_token(kDigits);
    const int token = m * (8 / kColumns) + g / kColumns;
    const int digit_row = kDigits * min(token, p.T - 1) + min(g % kColumns, kDigits - 1);
    b_row[m] = smem + digit_row * p.x_stride + q * (kGroup / 4);
  }
  // Quads holding digits 0 and 1 sum C0 + 256 C1; with 3 digits q odd holds digit 2 (and
  // column 3, unused), with byte codes digits 2 and 3 (C2 + 256 C3).
  const int high = kDigits == 3 && q % 2 ? 0 : 256;
  int row0 = (int(blockIdx.x) * tiles_per_unit + warp / p.split) * kTileRows, stage = stage_begin;
  uint32_t slot_addr = ring_addr;

  for (int i = 0; i < n_stages; ++i) {
    if constexpr (!kWholeRing) {
      if (i + kStages - 1 < n_stages) issue();
      copy_async_commit();
    }
    copy_async_wait<kStages - 1>();  // stage i; the ones after it may be in flight
    __syncwarp();
    const uint8_t* slot = ring + (slot_addr - ring_addr);
    slot_addr += Sh::kStageBytes;
    if (slot_addr == ring_end) slot_addr = ring_addr;
    // Rows g and g + 8: the stage's scales, then its biases.
    uint32_t sb_top[2 * kSb / 4], sb_bottom[2 * kSb / 4];
    load_words(sb_top, slot + Sh::kCodeBytes + g * 2 * kSb);
    load_words(sb_bottom, slot + Sh::kCodeBytes + (g + 8) * 2 * kSb);
#pragma unroll
    for (int gi = 0; gi < kSg; ++gi) {
      const int group = stage * kSg + gi;
      uint32_t top[Sh::kLaneWords], bottom[Sh::kLaneWords];  // rows g and g + 8
      const int at = gi * Sh::kGroupBytes + q * Sh::kLaneBytes;
      load_words(top, slot + g * Sh::kRowStride + at);
      load_words(bottom, slot + (g + 8) * Sh::kRowStride + at);
      // B for the group's steps: the lane's G / 4 digits of its column, 8 a step.
      uint32_t b[kMmas][kGroup / 16];
#pragma unroll
      for (int m = 0; m < kMmas; ++m) load_words(b[m], b_row[m] + group * kGroup);
      // With two mmas a step or more, consecutive k-steps sum into separate
      // accumulators (two chains), so that no mma waits for the one before it:
      // int4 T = 8 +5% (docs/benchmarks.md); integer sums, so the result is the
      // same. With one, the adds cost more than the wait (T = 1-4 -0.5%).
      constexpr int kChains = Sh::kSteps >= 2 && kMmas >= 2 ? 2 : 1;
      int c[kChains][kMmas][4] = {};
#pragma unroll
      for (int s = 0; s < Sh::kSteps; ++s) {
        // A: k slots 4q..4q+3 (a0 row g, a1 row g + 8) and 16+4q..16+4q+3 (a2, a3).
        uint32_t a[4];
        if constexpr (kBits == 8) {
          a[0] = top[2 * s], a[1] = bottom[2 * s], a[2] = top[2 * s + 1], a[3] = bottom[2 * s + 1];
        } else if constexpr (kDigits == kByteCodes) {
          // Step 2 p: the lane's stored bytes 8 p .. 8 p + 7 (against y); step 2 p + 1: their low codes (against z).
          const int w = s / 2 * 2;
          const uint32_t keep = s % 2 ? 0x0F0F0F0Fu : 0xFFFFFFFFu;
          a[0] = top[w] & keep, a[1] = bottom[w] & keep, a[2] = top[w + 1] & keep, a[3] = bottom[w + 1] & keep;
        } else {  // codes 0 2 4 6 and 1 3 5 7 of the word, as bytes
          a[0] = top[s] & 0x0F0F0F0Fu, a[1] = bottom[s] & 0x0F0F0F0Fu;
          a[2] = (top[s] >> 4) & 0x0F0F0F0Fu, a[3] = (bottom[s] >> 4) & 0x0F0F0F0Fu;
        }
#pragma unroll
        for (int m = 0; m < kMmas; ++m) mma(c[s % kChains][m], a, b[m][2 * s], b[m][2 * s + 1]);
      }
#pragma unroll
      for (int k = 1; k < kChains; ++k)
#pragma unroll
        for (int m = 0; m < kMmas; ++m)
#pragma unroll
          for (int j = 0; j < 4; ++j) c[0][m][j] += c[k][m][j];
      const float st = unpack_scale<S>(sb_top, gi), sb = unpack_scale<S>(sb_bottom, gi);
      const float bt = unpack_scale<S>(sb_top + kSb / 4, gi), bb = unpack_scale<S>(sb_bottom + kSb / 4, gi);
#pragma unroll
      for (int m = 0; m < kMmas; ++m) {
        const float2 f = factors[(group * kMmas + m) * 4 + q];
        const int sum_top = c[0][m][0] + high * c[0][m][1], sum_bottom = c[0][m][2] + high * c[0][m][3];
        acc[m][0] = fmaf(st * f.x, __int2float_rn(sum_top), fmaf(bt, f.y, acc[m][0]));
        acc[m][1] = fmaf(sb * f.x, __int2float_rn(sum_bottom), fmaf(bb, f.y, acc[m][1]));
      }
    }
    __syncwarp();  // every lane is done with the slot before it is refilled
    if constexpr (kWholeRing) {
      if (i + kStages < n_stages) issue();
      copy_async_commit();
    }
    if (++stage != stage_end) continue;

    // The tile's last stage: the split warps' sums meet in a fixed order, then
    // (3 digits) lane q + 1 adds its digit 2 to lane q's digits 0 and 1, which writes.
    tiles::add_split_sums<kMmas>(acc, partial, p.split, warp, part, lane);
    if (part == 0) {
#pragma unroll
      for (int m = 0; m < kMmas; ++m) {
        float top = acc[m][0], bottom = acc[m][1];
        if constexpr (kPairedQuads) {
          top += __shfl_xor_sync(0xffffffffu, top, 1);
          bottom += __shfl_xor_sync(0xffffffffu, bottom, 1);
          if (q % 2) continue;
        }
        const int t = token_of(m, q);
        if (t >= p.T) continue;
        float* y = tiles::output_row<kMode>(p.y, t, p.out, row0, p.d_ff, p.pairs, token);
        if (row0 + g < p.out) y[row0 + g] = prior[m][0] + (top + bias[0]);
        if (row0 + g + 8 < p.out) y[row0 + g + 8] = prior[m][1] + (bottom + bias[1]);
      }
    }
#pragma unroll
    for (int m = 0; m < kMmas; ++m) acc[m][0] = acc[m][1] = 0;
    stage = stage_begin;
    row0 += unit_rows;
    if (part == 0) read_tile_addends(row0);
  }
  copy_async_wait<0>();
  if constexpr (kMarks) PHASE_MARK(6);
}

// ---- host side ----

using tiles::max_smem;

template <int kBits, int kGroup, typename S, int kMmas, int kDigits>
struct Variant {
  using Sh = Shape<kBits, kGroup, S>;
  static constexpr int kWeightBits = kBits;
  static constexpr int kMmaCount = kMmas;
  static constexpr int kDigitCount = kDigits;
  template <int kMode, int kStages = Sh::kStages, bool kWarpRouted = false>
  static constexpr auto kernel_for =
      affine_matvec_mma_kernel<kBits, kGroup, S, kMmas, kDigits, kMode, kStages, 128, kWarpRouted>;
  // Functions, not data members, for what only the dense launches read: the
  // experts' byte-coded variants (lever int4_byte_codes) never do, and nvcc
  // reports a data member never read (warning #177).
  static constexpr auto kernel() { return kernel_for<kDense>; }
  // Lever wide_batch_stages: 256 bytes of each row a stage at 5-8 tokens (two
  // digits) of int8 weights with 16-bit scales (g32 and g64: g128's stages
  // take 256 bytes already). int4 measured level in the model (+1% at 5
  // tokens, -0.4% at 8), and its g128 kernel spilled, as did f32 scales'.
  using Wide = Shape<kBits, kGroup, S, 256>;
  // Worked out without reading Wide's members: where Wide is not used (int8 g128, whose
  // stages take two 128-byte groups anyway) nvcc reported them unused (warning #177).
  static constexpr bool has_wide() {
    return kBits == 8 && kMmas == 2 && kDigits == 2 && sizeof(S) == 2 &&
           stage_groups(kBits, kGroup, 256) > Sh::kStageGroups;
  }
  static constexpr auto wide_kernel() {  // instantiated only where called (has_wide())
    return affine_matvec_mma_kernel<kBits, kGroup, S, kMmas, kDigits, kDense, Wide::kStages, 256>;
  }

  static Layout layout_for(int64_t in, int64_t T, int stages = Sh::kStages) {
    return layout(int(in), kGroup, int(T), kDigits, Sh::kStageBytes, stages);
  }
  // One part's image in the scratch, rounded to whole 16-byte copies.
  static int64_t part_image_bytes(int64_t part_in, int64_t T) {
    return (layout_for(part_in, T).staged_bytes + 15) / 16 * 16;
  }
  // The launches a row is cut into: `parts` of `columns` each, whole stages,
  // the last taking what is left. The fewest equal launches whose x fits in a
  // block's shared memory with the rings (down_proj's 14336 columns at 4-8
  // tokens take 2-3); where none does (Qwen3-4B's 9,728 = 38 stages at 9-16
  // tokens: 19 do not fit, and 38 has no other divisor up to kMaxParts), under
  // lever uneven_row_cuts the fewest launches of the same size but the last,
  // which is shorter and keeps their image layout (13 + 13 + 12 stages).
  // parts 0 if none fits.
  struct Cut {
    int parts = 0;
    int64_t columns = 0;
    int64_t columns_of(const AffineArgs& w, int part) const {
      return part + 1 < parts ? columns : w.in - (parts - 1) * columns;
    }
    bool even(const AffineArgs& w) const { return parts * columns == w.in; }
  };
  static Cut cut_for(const AffineArgs& w, int64_t T) {
    const int64_t row_stages = w.in / Sh::kStageValues;
    for (int parts = 1; parts <= kMaxParts; ++parts)
      if (row_stages % parts == 0 && layout_for(w.in / parts, T).total <= max_smem())
        return {parts, w.in / parts};
    for (int parts = 2; uneven_row_cuts && parts <= kMaxParts; ++parts) {
      const int64_t stages = (row_stages + parts - 1) / parts;
      if (stages * (parts - 1) >= row_stages) continue;  // the last launch would be empty
      if (layout_for(stages * Sh::kStageValues, T).total <= max_smem())
        return {parts, stages * Sh::kStageValues};
    }
    return {};
  }
  // A row a whole number of stages, scales and biases aligned for their
  // copies, and x's copy in one block's shared memory, in at most kMaxParts launches.
  static bool fits(const AffineArgs& w, int64_t T) {
    constexpr uintptr_t kScaleCopy = Sh::kScaleRowBytes < 16 ? Sh::kScaleRowBytes : 16;
    return w.in % Sh::kStageValues == 0 && reinterpret_cast<uintptr_t>(w.scales) % kScaleCopy == 0 &&
           reinterpret_cast<uintptr_t>(w.biases) % kScaleCopy == 0 && cut_for(w, T).parts > 0;
  }
  // The scratch launch() needs: every part's image.
  static int64_t scratch_bytes(const AffineArgs& w, int64_t T) {
    const Cut cut = cut_for(w, T);
    return cut.parts * part_image_bytes(cut.columns, T);
  }
  template <auto kKernel>
  static int occupancy(int64_t smem) {
    static const cudaError_t raised =
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem());
    (void)raised;
    int blocks = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kKernel, kWarps * 32, size_t(smem));
    return blocks;
  }
  template <int kMode = kDense, int kStages = Sh::kStages, bool kWarpRouted = false>
  static int blocks_per_sm(int64_t smem) {
    return occupancy<kernel_for<kMode, kStages, kWarpRouted>>(smem);
  }

  // The experts' decode matvecs, one token's image (T = 1 layout) per block.
  // Whether matrix `m` can be read in whole stages, with `in` columns a block.
  static bool moe_fits(const ExpertMatrix& m, int64_t in) {
    constexpr uintptr_t kScaleCopy = Sh::kScaleRowBytes < 16 ? Sh::kScaleRowBytes : 16;
    return m.cols % Sh::kStageValues == 0 && reinterpret_cast<uintptr_t>(m.w) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(m.scales) % kScaleCopy == 0 &&
           reinterpret_cast<uintptr_t>(m.biases) % kScaleCopy == 0 && layout_for(in, 1).total <= max_smem();
  }
  // Gate/up (kMoeGateUp: `m` the gate stack, `up` the up stack) or down
  // (kMoeDown: `m` the down stack, `in` = k columns of it) over the images at `staged`.
  template <int kMode>
  static cudaError_t launch_moe(const MoeExpertsArgs& a, const ExpertMatrix& m, const ExpertMatrix& up, int64_t in,
                                const uint8_t* staged, float* y, cudaStream_t stream) {
    if constexpr (kBits == 8)
      if (moe_ring_stages<kMode>(a, in) == kDeepRingStages)
        return launch_moe_with<kMode, kDeepRingStages>(a, m, up, in, staged, y, stream);
    return launch_moe_with<kMode, Sh::kStages>(a, m, up, in, staged, y, stream);
  }
  // How a launch of `kStages` stages a warp deals its work: blocks an SM (0 if
  // one does not fit), warps a tile, units and the grid.
  struct MoeGrid {
    int per_sm = 0, split = 0, n_units = 0;
    dim3 grid;
  };
  template <int kMode, int kStages, bool kWarpRouted = false>
  static MoeGrid moe_grid_for(const MoeExpertsArgs& a, int64_t in) {
    MoeGrid g;
    g.per_sm = blocks_per_sm<kMode, kStages, kWarpRouted>(layout_for(in, 1, kStages).total);
    if (g.per_sm < 1) return g;
    const int64_t slots = int64_t(g.per_sm) * sm_count();
    const int64_t blocks_y = tiles::moe_block_rows<kMode>(a.T, a.k);
    const int out = tiles::moe_rows<kMode>(a.d_ff, a.d_model);
    const int n_tiles = (out + kTileRows - 1) / kTileRows, row_stages = int(in / Sh::kStageValues);
    // Down: a warp per slot (its expert's stages of the concatenated row).
    g.split = kMode == kMoeDown ? int(a.k)
                                : tiles::split_for(int(n_tiles * blocks_y), row_stages, slots, Sh::kStages - 1);
    g.n_units = (n_tiles + kWarps / g.split - 1) / (kWarps / g.split);
    g.grid = tiles::moe_grid(g.n_units, slots, blocks_y);
    return g;
  }
  // Lever deep_moe_ring: one token of int8 experts takes the deeper ring
  // wherever a block of it fits (docs/levers.md: int4 and batches of 2-8
  // measured no faster); else the Shape's ring.
  template <int kMode>
  static int moe_ring_stages(const MoeExpertsArgs& a, int64_t in) {
    const bool deep = deep_moe_ring && kBits == 8 && a.T == 1 &&
                      layout_for(in, 1, kDeepRingStages).total <= max_smem() &&
                      moe_grid_for<kMode, kDeepRingStages>(a, in).per_sm > 0;
    return deep ? kDeepRingStages : Sh::kStages;
  }
  // Gate/up that routes its token takes the kernel of warps that route alone where routes_in_a_warp.
  template <int kMode, int kStages>
  static cudaError_t launch_moe_with(const MoeExpertsArgs& a, const ExpertMatrix& m, const ExpertMatrix& up,
                                     int64_t in, const uint8_t* staged, float* y, cudaStream_t stream) {
    if constexpr (kMode == kMoeGateUp)
      if (a.route.logits && routes_in_a_warp(a.route))
        return launch_moe_as<kMode, kStages, true>(a, m, up, in, staged, y, stream);
    return launch_moe_as<kMode, kStages, false>(a, m, up, in, staged, y, stream);
  }
  template <int kMode, int kStages, bool kWarpRouted>
  static cudaError_t launch_moe_as(const MoeExpertsArgs& a, const ExpertMatrix& m, const ExpertMatrix& up,
                                   int64_t in, const uint8_t* staged, float* y, cudaStream_t stream) {
    const Layout l = layout_for(in, 1, kStages);
    const MoeGrid g = moe_grid_for<kMode, kStages, kWarpRouted>(a, in);
    if (g.per_sm < 1) return cudaErrorInvalidValue;
    const int out = tiles::moe_rows<kMode>(a.d_ff, a.d_model);
    Problem p{};
    p.streamed_weights = streamed_weights;
    p.packed = static_cast<const uint8_t*>(m.w);
    p.scales = m.scales;
    p.biases = m.biases;
    p.row_bytes = m.cols * kBits / 8;
    p.scale_stride = int(m.cols / kGroup);
    p.staged = staged;
    p.x_stride = l.x_stride;
    p.x_bytes = l.x_bytes;
    p.staged_bytes = l.staged_bytes;
    p.image_bytes = part_image_bytes(in, 1);
    p.y = y;
    p.in = int(in);
    p.out = out;
    p.T = 1;
    p.n_groups = int(in / kGroup);
    p.split = g.split;
    p.n_units = g.n_units;
    p.ids = a.ids;
    if constexpr (kMode == kMoeGateUp) {
      p.route = a.route;
      PHASE_PROBE_REPORT("start", "routing: scored", "routing: counted", "stages about to issue", "waited",
                         "x and first stages in", "end", "warp routing: max", "warp routing: bound",
                         "warp routing: gathered");
    }
    p.accumulate = kMode == kMoeDown && a.accumulate;  // the residual add (moe_launchers.h)
    p.k = int(a.k);
    p.d_ff = int(a.d_ff);
    p.pairs = int(a.T * a.k);
    p.expert_stride = m.expert_stride;
    p.up_packed = static_cast<const uint8_t*>(up.w);
    p.up_scales = up.scales;
    p.up_biases = up.biases;
    return launch_kernel(kernel_for<kMode, kStages, kWarpRouted>, g.grid, dim3(kWarps * 32), size_t(l.total), stream,
                         p);
  }
  // One launch of the prepare kernel: x [T, d] or the gate/up products [2][pairs][d_ff]
  // (silu-gated, scaled by the routing weights) into one image per token of `in` columns.
  static cudaError_t prepare_moe(const float* x, int64_t T, int64_t in, const float* pair_weights, int64_t pair_cols,
                                 uint8_t* staged, cudaStream_t stream) {
    const Layout l = layout_for(in, 1);
    Prepare prep{};
    prep.x = x;
    prep.full = int(T * in);  // the tokens' rows as one row, each token's columns a part
    prep.T = 1;
    prep.part = int(in);
    prep.x_stride = l.x_stride;
    prep.staged = staged;
    prep.x_bytes = l.x_bytes;
    prep.part_bytes = part_image_bytes(in, 1);
    prep.pair_weights = pair_weights;
    prep.pair_cols = int(pair_cols);
    prep.allow_after_wait = true;  // the matvec after it reads the routing's ids before its wait
    using Kind = AffineMmaInput::Kind;
    const dim3 grid(unsigned(ceil_div(T * in / 8, 256)));
    if (pair_weights)
      return launch_kernel(affine_mma_prepare_kernel<kBits, kGroup, kDigits, int(Kind::silu_gated), float>, grid,
                           dim3(256), 0, stream, prep);
    return launch_kernel(affine_mma_prepare_kernel<kBits, kGroup, kDigits, int(Kind::plain), float>, grid, dim3(256),
                         0, stream, prep);
  }

  // The experts' x images from h, RMSNorm'd on the way (MoeExpertsArgs::norm_w):
  // a row of blocks a token.
  static cudaError_t prepare_moe_normed(const MoeExpertsArgs& a, uint8_t* staged, cudaStream_t stream) {
    const Layout l = layout_for(a.d_model, 1);
    Prepare prep{};
    prep.x = a.x;
    prep.norm_w = a.norm_w;
    prep.eps = a.eps;
    prep.full = int(a.d_model);
    prep.T = int(a.T);
    prep.part = int(a.d_model);
    prep.x_stride = l.x_stride;
    prep.staged = staged;
    prep.x_bytes = l.x_bytes;
    prep.part_bytes = part_image_bytes(a.d_model, 1);
    prep.allow_after_wait = true;  // as prepare_moe's
    prep.image_per_token = true;
    prep.input_final = a.x_final;
    const dim3 grid(unsigned(ceil_div(a.d_model / 8, 256)), unsigned(a.T));
    cudaError_t status = cudaSuccess;
    const cudaError_t visited = visit_float(a.norm_dtype, [&]<typename N>() {
      status = launch_kernel(affine_mma_prepare_kernel<kBits, kGroup, kDigits, int(AffineMmaInput::Kind::rms_normed), N>,
                             grid, dim3(256), 0, stream, prep);
    });
    return visited != cudaSuccess ? visited : status;
  }

  // The ring stages a warp of a dense launch of `in` columns keeps (lever
  // deep_dense_ring), and that launch's layout, blocks an SM and kernel.
  struct DenseLaunch {
    Layout l;
    int per_sm;
    decltype(kernel()) kernel_used;
    int stage_values, stages;  // the kernel's Shape
  };
  // `even`: every launch of the row takes `in` columns (wide stages need that).
  static DenseLaunch dense_launch(int64_t in, int64_t T, int parts, bool even) {
    const Layout l = layout_for(in, T);
    const int per_sm = blocks_per_sm(l.total);
    if constexpr (kBits == 8 && kMmas == 1 && kDigits == 3) {
      if (deep_dense_ring && T == 1 && parts == 1 && per_sm > 0) {
        const Layout deep = layout_for(in, T, kDeepRingStages);
        if (deep.total <= max_smem() && blocks_per_sm<kDense, kDeepRingStages>(deep.total) == per_sm)
          return {deep, per_sm, kernel_for<kDense, kDeepRingStages>, Sh::kStageValues, kDeepRingStages};
      }
    }
    if constexpr (has_wide()) {
      // Only where the blocks an SM stay (one: x's image at 5-8 tokens).
      if (wide_batch_stages && even && per_sm > 0 && in % Wide::kStageValues == 0) {
        const Layout wide = layout(int(in), kGroup, int(T), kDigits, Wide::kStageBytes, Wide::kStages);
        if (wide.total <= max_smem() && occupancy<wide_kernel()>(wide.total) == per_sm)
          return {wide, per_sm, wide_kernel(), Wide::kStageValues, Wide::kStages};
      }
    }
    return {l, per_sm, kernel(), Sh::kStageValues, Sh::kStages};
  }

  // Warps a tile for launches of `in` columns (tiles::split_for, minding the
  // factors' lines in L1).
  static int split_of(const AffineArgs& w, int64_t in, const DenseLaunch& d) {
    const int n_tiles = int((w.out + kTileRows - 1) / kTileRows), row_stages = int(in / d.stage_values);
    const int64_t factor_row_bytes = in / kGroup * int64_t(sizeof(S));
    const tiles::FactorLines factors{d.per_sm, int((factor_row_bytes + 127) / 128),
                                     tiles::l1_bytes_beside(d.per_sm, d.l.total)};
    return tiles::split_for(n_tiles, row_stages, int64_t(d.per_sm) * sm_count(), d.stages - 1, &factors);
  }
  // The split of the first launch, for tests; 0 where the kernel does not run.
  static int first_split(const AffineArgs& w, int64_t T) {
    if (!fits(w, T)) return 0;
    const Cut cut = cut_for(w, T);
    const DenseLaunch d = dense_launch(cut.columns, T, cut.parts, cut.even(w));
    return d.per_sm < 1 ? 0 : split_of(w, cut.columns, d);
  }

  static cudaError_t launch(const AffineArgs& w, const AffineMmaInput& input, const float* bias, float* y, int64_t T,
                            void* scratch, bool accumulate, cudaStream_t stream) {
    if (!fits(w, T)) return cudaErrorInvalidValue;
    const Cut cut = cut_for(w, T);
    const int64_t in = cut.columns;  // every launch's but an uneven cut's last
    const DenseLaunch d = dense_launch(in, T, cut.parts, cut.even(w));
    const Layout& l = d.l;
    const int per_sm = d.per_sm;
    if (per_sm < 1) return cudaErrorInvalidValue;
    const int64_t slots = int64_t(per_sm) * sm_count();
    const int n_tiles = int((w.out + kTileRows - 1) / kTileRows);
    Problem p{};
    p.streamed_weights = streamed_weights;
    p.row_bytes = w.in * kBits / 8;
    p.scale_stride = int(w.in / kGroup);
    p.x_stride = l.x_stride;
    p.x_bytes = l.x_bytes;
    p.staged_bytes = l.staged_bytes;
    p.y = y;
    p.out = int(w.out);
    p.T = int(T);
    // One launch converts the whole row into the parts' images; then each part's
    // matvec adds its columns' product into y, the first with the bias (and
    // setting y unless the caller accumulates).
    const int64_t part_bytes = part_image_bytes(in, T);
    // The splits the prepare kernel reads: those the attention grid wrote.
    const int live_splits = input.live_splits > 0 ? std::min(input.live_splits, input.splits) : input.splits;
    const Prepare prep{input.x,         input.norm_w,    input.eps,    int(w.in),     int(T),
                       int(in),         l.x_stride,      static_cast<uint8_t*>(scratch), l.x_bytes, part_bytes,
                       input.split_max, input.split_sum, input.splits, input.head_dim,
                       live_splits,     nullptr,         0,               false,
                       false,           false};
    const dim3 runs_grid(unsigned(ceil_div(int(T * w.in / 8), 256)));          // a thread a run
    const dim3 token_grid(unsigned(ceil_div(int(w.in / 8), 256)), unsigned(T));  // kRmsNormed
    using Kind = AffineMmaInput::Kind;
    cudaError_t status = cudaSuccess;
    if (input.kind == Kind::rms_normed) {
      const cudaError_t visited = visit_float(input.norm_dtype, [&]<typename N>() {
        status = launch_kernel(affine_mma_prepare_kernel<kBits, kGroup, kDigits, int(Kind::rms_normed), N>, token_grid,
                               dim3(256), 0, stream, prep);
      });
      if (visited != cudaSuccess) return visited;
    } else if (input.kind == Kind::attention_splits) {
      status = launch_kernel(affine_mma_prepare_splits_kernel<kBits, kGroup, kDigits>,
                             dim3(unsigned(ceil_div(int(T * w.in / 8), 32))),
                             dim3(unsigned(32 * ceil_div(live_splits, kSplitsPerWarp))), 0, stream, prep);
    } else if (input.kind == Kind::silu_gated) {
      status = launch_kernel(affine_mma_prepare_kernel<kBits, kGroup, kDigits, int(Kind::silu_gated), float>,
                             runs_grid, dim3(256), 0, stream, prep);
    } else {
      status = launch_kernel(affine_mma_prepare_kernel<kBits, kGroup, kDigits, int(Kind::plain), float>, runs_grid,
                             dim3(256), 0, stream, prep);
    }
    if (status != cudaSuccess) return status;
    for (int part = 0; part < cut.parts; ++part) {
      const int64_t col0 = part * in, columns = cut.columns_of(w, part);
      p.in = int(columns);
      p.n_groups = int(columns / kGroup);
      p.split = split_of(w, columns, d);
      p.n_units = (n_tiles + kWarps / p.split - 1) / (kWarps / p.split);
      p.packed = reinterpret_cast<const uint8_t*>(w.packed) + col0 * kBits / 8;
      p.scales = static_cast<const S*>(w.scales) + col0 / kGroup;
      p.biases = static_cast<const S*>(w.biases) + col0 / kGroup;
      p.staged = static_cast<const uint8_t*>(scratch) + part * part_bytes;
      p.bias = part == 0 ? bias : nullptr;
      p.accumulate = accumulate || part > 0;
      const int grid = int(std::min<int64_t>(p.n_units, slots));
      status = launch_kernel(d.kernel_used, dim3(grid), dim3(kWarps * 32), size_t(l.total), stream, p);
      if (status != cudaSuccess) return status;
    }
    return cudaSuccess;
  }
};

// Calls fn with the Variant for the weight's bits, group, scale type, T and x's digits.
template <typename Fn>
cudaError_t visit_variant(const AffineArgs& w, int64_t T, int digits, Fn&& fn) {
  return visit_float(w.scale_dtype, [&]<typename S>() {
    auto by_group = [&]<int kBits, int kMmas, int kDigits>() {
      if (w.group_size == 32) fn(Variant<kBits, 32, S, kMmas, kDigits>{});
      else if (w.group_size == 64) fn(Variant<kBits, 64, S, kMmas, kDigits>{});
      else fn(Variant<kBits, 128, S, kMmas, kDigits>{});
    };
    auto by_mmas = [&]<int kBits>() {
      const int mmas = mmas_for(int(T), digits);
      if (digits == 2) {
        if (mmas == 1) by_group.template operator()<kBits, 1, 2>();
        else if (mmas == 2) by_group.template operator()<kBits, 2, 2>();
        else if (mmas == 3) by_group.template operator()<kBits, 3, 2>();
        else by_group.template operator()<kBits, 4, 2>();
      } else if (mmas == 1) {
        by_group.template operator()<kBits, 1, 3>();
      } else if (mmas == 2) {
        by_group.template operator()<kBits, 2, 3>();
      } else if (mmas == 3) {
        by_group.template operator()<kBits, 3, 3>();
      } else {
        by_group.template operator()<kBits, 4, 3>();
      }
    };
    w.bits == 4 ? by_mmas.template operator()<4>() : by_mmas.template operator()<8>();
  });
}

// What visit_variant can dispatch; each Variant then checks that it fits.
bool shape_supported(const AffineArgs& w, int64_t T, int digits) {
  if ((digits != 2 && digits != 3) || T < 1 || T > max_tokens(digits) || (w.bits != 4 && w.bits != 8)) return false;
  if (w.group_size != 32 && w.group_size != 64 && w.group_size != 128) return false;
  if (w.in <= 0 || w.out <= 0 || w.in > (1 << 20) || w.out > (1 << 30)) return false;
  return reinterpret_cast<uintptr_t>(w.packed) % 16 == 0;
}

// Calls fn with the one-token Variant (three digits, or lever int4_byte_codes'
// form for int4 g64 and g128) for an expert stack's format.
template <typename Fn>
cudaError_t visit_expert_variant(const ExpertMatrix& m, Fn&& fn) {
  return visit_float(m.dtype, [&]<typename S>() {
    auto by_group = [&]<int kBits>() {
      if constexpr (kBits == 4) {
        if (int4_byte_codes && m.group_size >= 64) {
          if (m.group_size == 64) fn(Variant<4, 64, S, 1, kByteCodes>{});
          else fn(Variant<4, 128, S, 1, kByteCodes>{});
          return;
        }
      }
      if (m.group_size == 32) fn(Variant<kBits, 32, S, 1, 3>{});
      else if (m.group_size == 64) fn(Variant<kBits, 64, S, 1, 3>{});
      else fn(Variant<kBits, 128, S, 1, 3>{});
    };
    m.bits == 4 ? by_group.template operator()<4>() : by_group.template operator()<8>();
  });
}

bool same_format(const ExpertMatrix& a, const ExpertMatrix& b) {
  return a.bits == b.bits && a.group_size == b.group_size && a.dtype == b.dtype && a.cols == b.cols &&
         a.expert_stride == b.expert_stride;
}

tiles::MoeScratch moe_scratch(const MoeExpertsArgs& a) {
  int64_t x_image = 0, act_image = 0;
  visit_expert_variant(a.gate, [&](auto v) { x_image = decltype(v)::part_image_bytes(a.d_model, 1); });
  visit_expert_variant(a.down, [&](auto v) { act_image = decltype(v)::part_image_bytes(a.k * a.d_ff, 1); });
  return tiles::moe_scratch(a.T, a.k, a.d_ff, x_image, act_image);
}

}  // namespace

bool moe_experts_mma_supports(const MoeExpertsArgs& a) {
  const bool affine = a.gate.bits != 0 && a.down.bits != 0;
  if (!affine || !same_format(a.gate, a.up) || a.T < 1 || a.T > kMaxTensorCoreMatvecTokens || a.k < 1 ||
      kWarps % a.k != 0 || a.d_ff % kTileRows != 0 || a.T * a.k > 65535)
    return false;
  if (a.norm_w && a.norm_dtype != DType::f32 && a.norm_dtype != DType::f16 && a.norm_dtype != DType::bf16) return false;
  for (const ExpertMatrix* m : {&a.gate, &a.up, &a.down})
    if ((m->bits != 4 && m->bits != 8) || (m->group_size != 32 && m->group_size != 64 && m->group_size != 128))
      return false;
  bool fits = false;
  visit_expert_variant(a.gate, [&](auto v) {
    using V = decltype(v);
    fits = V::moe_fits(a.gate, a.d_model) && V::moe_fits(a.up, a.d_model);
  });
  if (!fits) return false;
  visit_expert_variant(a.down, [&](auto v) { fits = decltype(v)::moe_fits(a.down, a.k * a.d_ff); });
  if (!fits || !a.route.logits) return fits;
  // Routing in gate/up: the choice must fit before the ring in a block's shared memory.
  if (!routing_fits(a)) return false;
  visit_expert_variant(a.gate, [&](auto v) {
    fits = routing_scratch_bytes(a.route.E) <= decltype(v)::layout_for(a.d_model, 1).total;
  });
  return fits;
}

int64_t moe_experts_mma_scratch_bytes(const MoeExpertsArgs& a) { return moe_scratch(a).total; }

cudaError_t launch_moe_experts_mma(const MoeExpertsArgs& a, void* scratch, cudaStream_t stream) {
  if (!moe_experts_mma_supports(a)) return cudaErrorInvalidValue;
  const tiles::MoeBuffers b = tiles::moe_buffers(moe_scratch(a), scratch, a.x);
  if (!b.x_images) return cudaErrorInvalidValue;
  cudaError_t status = cudaSuccess;
  cudaError_t dispatch = visit_expert_variant(a.gate, [&](auto v) {
    using V = decltype(v);
    status = a.norm_w ? V::prepare_moe_normed(a, b.x_images, stream)
                      : V::prepare_moe(a.x, a.T, a.d_model, nullptr, 0, b.x_images, stream);
    if (status == cudaSuccess)
      status = V::template launch_moe<kMoeGateUp>(a, a.gate, a.up, a.d_model, b.x_images, b.products, stream);
  });
  if (status != cudaSuccess || dispatch != cudaSuccess) return status != cudaSuccess ? status : dispatch;
  dispatch = visit_expert_variant(a.down, [&](auto v) {
    using V = decltype(v);
    status = V::prepare_moe(b.products, a.T, a.k * a.d_ff, a.weights, a.d_ff, b.act_images, stream);
    if (status == cudaSuccess)
      status = V::template launch_moe<kMoeDown>(a, a.down, a.down, a.k * a.d_ff, b.act_images, a.out, stream);
  });
  return status != cudaSuccess ? status : dispatch;
}

void set_deep_moe_ring(bool on) { deep_moe_ring = on; }
void set_deep_dense_ring(bool on) { deep_dense_ring = on; }
void set_streamed_weights(bool on) { streamed_weights = on; }
void set_wide_batch_stages(bool on) { wide_batch_stages = on; }
void set_uneven_row_cuts(bool on) { uneven_row_cuts = on; }
void set_int4_byte_codes(bool on) { int4_byte_codes = on; }
bool int4_byte_codes_enabled() { return int4_byte_codes; }
bool streamed_weights_enabled() { return streamed_weights; }
bool deep_moe_ring_enabled() { return deep_moe_ring; }

MoeRingStages moe_experts_mma_ring_stages(const MoeExpertsArgs& a) {
  MoeRingStages stages;
  visit_expert_variant(a.gate, [&](auto v) {
    stages.gate_up = decltype(v)::template moe_ring_stages<kMoeGateUp>(a, a.d_model);
  });
  visit_expert_variant(a.down, [&](auto v) {
    stages.down = decltype(v)::template moe_ring_stages<kMoeDown>(a, a.k * a.d_ff);
  });
  return stages;
}

MmaKernelLocal affine_matvec_mma_most_local() {
  MmaKernelLocal most;
  auto check = [&](const void* kernel, const AffineArgs& w, int mmas, int digits, const char* mode) {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && int64_t(attr.localSizeBytes) > most.bytes)
      most = {int64_t(attr.localSizeBytes), w.bits, w.group_size, mmas, digits, w.scale_dtype, mode};
  };
  // Every kernel the launches can pick: through the same dispatch, every format, T and digit count,
  // with lever int4_byte_codes off and on.
  const bool byte_codes_set = int4_byte_codes;
  for (const bool bytes : {false, true}) {
    int4_byte_codes = bytes;
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16})
      for (const int bits : {4, 8})
        for (const int group : {32, 64, 128}) {
          const AffineArgs w{.scale_dtype = dtype, .bits = bits, .group_size = group};
          for (const int digits : {2, 3})
            for (int T = 1; T <= max_tokens(digits); ++T)
              visit_variant(w, T, digits, [&](auto v) {
                using V = decltype(v);
                check(reinterpret_cast<const void*>(V::kernel()), w, mmas_for(T, digits), V::kDigitCount, "dense");
                if constexpr (V::kWeightBits == 8 && V::kMmaCount == 1 && V::kDigitCount == 3)  // deep_dense_ring's
                  check(reinterpret_cast<const void*>(V::template kernel_for<kDense, kDeepRingStages>), w, 1, 3,
                        "dense, deep ring");
                if constexpr (V::has_wide())  // wide_batch_stages'
                  check(reinterpret_cast<const void*>(V::wide_kernel()), w, mmas_for(T, digits), digits,
                        "dense, wide stages");
              });
          const ExpertMatrix m{.dtype = dtype, .bits = bits, .group_size = group};
          visit_expert_variant(m, [&](auto v) {
            using V = decltype(v);
            check(reinterpret_cast<const void*>(V::template kernel_for<kMoeGateUp>), w, V::kMmaCount, V::kDigitCount, "gate/up");
            check(reinterpret_cast<const void*>(V::template kernel_for<kMoeGateUp, V::Sh::kStages, true>), w, V::kMmaCount, V::kDigitCount,
                  "gate/up, each warp routing");
            check(reinterpret_cast<const void*>(V::template kernel_for<kMoeDown>), w, V::kMmaCount, V::kDigitCount, "down");
            if constexpr (V::kWeightBits == 8) {  // lever deep_moe_ring's
              check(reinterpret_cast<const void*>(V::template kernel_for<kMoeGateUp, kDeepRingStages>), w, 1, 3,
                    "gate/up, deep ring");
              check(reinterpret_cast<const void*>(V::template kernel_for<kMoeGateUp, kDeepRingStages, true>), w, 1, 3,
                    "gate/up, deep ring, each warp routing");
              check(reinterpret_cast<const void*>(V::template kernel_for<kMoeDown, kDeepRingStages>), w, 1, 3,
                    "down, deep ring");
            }
          });
        }
  }
  int4_byte_codes = byte_codes_set;
  return most;
}

bool affine_matvec_mma_supports(const AffineArgs& w, int64_t T, int digits) {
  if (!shape_supported(w, T, digits)) return false;
  bool fits = false;
  visit_variant(w, T, digits, [&](auto variant) { fits = decltype(variant)::fits(w, T); });
  return fits;
}

int affine_matvec_mma_split(const AffineArgs& w, int64_t T, int digits) {
  int split = 0;
  if (shape_supported(w, T, digits))
    visit_variant(w, T, digits, [&](auto variant) { split = decltype(variant)::first_split(w, T); });
  return split;
}

int64_t affine_matvec_mma_scratch_bytes(const AffineArgs& w, int64_t T, int digits) {
  int64_t bytes = layout(int(w.in), int(w.group_size), int(T), digits, 0, 0).staged_bytes;
  if (shape_supported(w, T, digits))
    visit_variant(w, T, digits,
                  [&](auto variant) { bytes = std::max(bytes, decltype(variant)::scratch_bytes(w, T)); });
  return bytes;
}

cudaError_t launch_affine_matvec_mma(const AffineArgs& w, const AffineMmaInput& input, const float* bias, float* y,
                                     int64_t T, void* scratch, cudaStream_t stream, bool accumulate) {
  if (!shape_supported(w, T, input.digits) || reinterpret_cast<uintptr_t>(input.x) % 16 ||
      reinterpret_cast<uintptr_t>(scratch) % 16)
    return cudaErrorInvalidValue;
  if (input.kind == AffineMmaInput::Kind::rms_normed && !input.norm_w) return cudaErrorInvalidValue;
  if (input.kind == AffineMmaInput::Kind::attention_splits &&
      (!input.split_max || !input.split_sum || input.splits < 1 || input.splits > kMaxAttentionSplits ||
       input.head_dim < 8 || input.head_dim % 8 || w.in % input.head_dim))
    return cudaErrorInvalidValue;
  cudaError_t status = cudaSuccess;
  const cudaError_t dispatch = visit_variant(w, T, input.digits, [&](auto variant) {
    status = decltype(variant)::launch(w, input, bias, y, T, scratch, accumulate, stream);
  });
  return status != cudaSuccess ? status : dispatch;
}

cudaError_t launch_affine_matvec_mma(const AffineArgs& w, const float* x, const float* bias, float* y, int64_t T,
                                     void* scratch, cudaStream_t stream, int digits) {
  return launch_affine_matvec_mma(w, AffineMmaInput{.x = x, .digits = digits}, bias, y, T, scratch, stream, false);
}

}  // namespace mere::cuda
