// MLX affine prefill GEMM that dequantizes its weight tiles on the way in
// (lever tensor_core_affine_gemm): y[T, out] = x[T, in] dequant(w)^T (+ bias).
//
// Why: the other path writes a bf16 copy of each weight (2 bytes a weight,
// read again by cuBLAS) before the GEMM, a fixed cost that short prompts feel
// most (Llama-3-8B gate_up: 93 of 162 us at 64 tokens). Here the packed codes
// stream from memory once per token tile and exist as bf16 only in registers.
// It is slower than that copy and cuBLAS on long prompts (0.64-0.69 of bf16
// against 0.92 at 4096 tokens), so affine_ops.cpp uses it up to 384 tokens.
//
// Shape: the product is computed as y^T = W x^T on Hopper's warpgroup MMA
// (wgmma.m64nNk16, f32 accumulators). A block takes 128 weight rows and N = 32,
// 64, 128 or 256 tokens; its two warpgroups take 64 rows each. The weight is the A
// operand, taken from registers: each thread reads its fragment's codes from
// shared memory and forms each value as scale * q + bias rounded once to bf16,
// as launch_affine_dequantize does (f32 there, and the bf16 FMA here for 4-bit
// codes with bf16 scales: the same wherever scale * q + bias is exact in f32),
// so both paths multiply the same bf16 weights. x is rounded to bf16 by a first
// kernel (permuted within each 64 for 4-bit codes, see affine_gemm_input_kernel)
// and is the B operand in shared memory (rows of 64 values, 128 bytes, in the
// 128-byte swizzle wgmma reads). Thread 0 streams each k-tile of 64 (x and the
// codes) by TMA into a ring of slots guarded by mbarriers; each thread loads
// its rows' scales and biases itself, a tile ahead. Where the grid holds fewer
// blocks than the SMs take at once, the k-tiles split into ranges (plan_for).
//
// Grouped by expert (the MoE experts' prefill, lever tensor_core_affine_moe_gemm):
// x's rows are the (token, slot) pairs sorted by expert, and a block's token
// tile holds pairs of one expert only, whose weight rows its codes come from
// (GemmProblem's offsets). Each expert's weights are then read once per tile of
// its pairs, and the MMAs past its last pair are wasted (tiles of 32-128 pairs).
// Grouped, the kernel also takes bf16 experts and FP8 E4M3 ones with an f32
// scale a 128 x 128 block (lever tensor_core_dense_moe_gemm): bf16 rows arrive
// in the 128-byte swizzle and each step's fragment is one ldmatrix; FP8 values
// sit as 8-bit codes do and are formed as scale * value rounded once to bf16,
// the bf16 weights the WMMA grouped GEMM multiplies.
//
// Fragment of thread (g, q) = (lane / 4, lane % 4) of warp w in its warpgroup,
// step s of a k-tile (16 values): rows 16 w + g and 16 w + g + 8, values
// 16 s + 2q, + 1 and 16 s + 8 + 2q, + 1 (the m16n8k16 layout). With 8-bit
// codes those are half q % 2 of words 4s + q / 2 and 4s + 2 + q / 2 of the
// row's tile; with 4-bit codes x's permutation makes them nibble pairs
// (i, i + 4) of words 2q and 2q + 1, which one mask turns into bf16x2.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/affine_launchers.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/fp8_launchers.h"

namespace mere::cuda {
namespace {

constexpr int kRows = 128;   // weight rows a block takes: two warpgroups of 64
constexpr int kTileK = 64;   // values of a k-tile: one 128-byte swizzled row of x
constexpr int kThreads = 256;
constexpr int kMaxSplits = 8;  // k-tile ranges of a split launch
constexpr uint32_t kMagic = 0x4B000000u;  // 2^23: OR-ing q < 2^8 into its mantissa gives 2^23 + q
constexpr float kTwo23 = 8388608.0f;

template <int kBits, int kN>
struct Layout {
  static constexpr int kCodeBytes = kTileK * kBits / 8;  // a row's codes of a tile
  static constexpr int kCodeStride = kCodeBytes;         // unpadded: a half-warp's rows hit distinct banks
  static constexpr int kXBytes = kN * 128;               // x: kN rows of 128 bytes, 1024-byte aligned
  static constexpr int kCodeAt = kXBytes;
  static constexpr int kStageBytes = kCodeAt + kRows * kCodeStride;  // a slot: x, then the codes
  static constexpr int kTileBytes = kStageBytes;                     // what a tile's two loads bring
  static_assert(kStageBytes % 1024 == 0, "each slot's x starts 1024-byte aligned (the swizzle's period)");
  // 256-token blocks take a whole SM's shared memory; smaller ones share it.
  static constexpr int kBlocksPerSm = kN == 256 ? 1 : 2;
  static constexpr int kBudget = 220 * 1024 / kBlocksPerSm;
  static constexpr int kStages = kBudget / kStageBytes < 6 ? kBudget / kStageBytes : 6;
  static constexpr int kSharedBytes = kStages * kStageBytes + 1024 + 16 * kStages;  // + alignment, barriers
};

// x and the codes arrive by TMA (the tensor memory accelerator): a map each,
// built on the host (make_map), read by the copy engine, which fills the rows
// of a box past T or out with zeros.
struct GemmProblem {
  CUtensorMap x_map;     // bf16 [T, in], boxes of kN tokens x 64 values, 128-byte swizzle
  CUtensorMap code_map;  // u8 [out, row_bytes], boxes of 128 rows x a tile's codes
  const void* scales;    // [out, n_groups]: each thread loads its own rows'
  const void* biases;
  int n_groups;
  int splits;         // k-tile ranges, 1-8: two add into y by atomics; more leave their sums in `partials`
  float* partials;    // [splits, T, out] (splits > 2), which the last split of a tile adds in order
  int* counters;      // [token tiles x row tiles] splits done, zeroed by affine_gemm_input_kernel
  bool sum_apart;     // lever split_sum_kernel: affine_gemm_sum_splits_kernel adds the slices, not the last split
  const float* bias;  // [out] or null
  float* y;           // [T, out]
  int T, in, out;
  // Grouped (the MoE experts' prefill, levers tensor_core_affine_moe_gemm and
  // tensor_core_dense_moe_gemm): x's
  // T rows are the (token, slot) pairs sorted by expert. Token tile blockIdx.x
  // belongs to the expert e with tile_offsets[e] <= it < tile_offsets[e + 1],
  // whose pairs are rows [offsets[e], offsets[e + 1]); its weights are the code
  // map's rows from e * expert_stride (out of them a block's), and y [T, out]
  // keeps the sorted rows.
  const int32_t* offsets;
  const int32_t* tile_offsets;
  int E;
  int expert_stride;
  // SwiGLU in the epilogue (grouped): the code map holds gate's rows and up_map
  // up's (boxes of 64 rows each); a block takes 64 columns of both, warpgroup 0
  // gate's and warpgroup 1 up's, and writes silu(gate) * up as bf16 into act
  // [T, out] in the order the down GEMM reads it (act_permute: 4-bit codes).
  CUtensorMap up_map;
  const void* up_scales;
  const void* up_biases;
  int up_expert_stride;
  __nv_bfloat16* act;
  int act_permute;
};

// Box (c0, c1) of a map (c0 the inner coordinate) into shared memory; its bytes
// complete a transaction of `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          dst),
      "l"(map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// wgmma B descriptor: K-major rows of 128 bytes in the 128-byte swizzle, 8-row
// atoms 1024 bytes apart (stride byte offset), leading byte offset unused.
__device__ __forceinline__ uint64_t swizzled_descriptor(uint32_t smem_addr) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across a wait.
template <int kN>
__device__ __forceinline__ void fence_accumulators(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d[64 x kN] += a[64 x 16] (registers, bf16) b[16 x kN] (shared, bf16). One
// specialisation per N: an asm statement's operand list (N / 2 accumulators)
// cannot be generated, so the four are written out.
template <int kN>
__device__ __forceinline__ void wgmma_bf16(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b);
template <>
__device__ __forceinline__ void wgmma_bf16<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, {%16, %17, %18, %19}, %20, 1, 1, 1, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

template <>
__device__ __forceinline__ void wgmma_bf16<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

template <>
__device__ __forceinline__ void wgmma_bf16<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
      "%59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, 1, 1, 1, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

template <>
__device__ __forceinline__ void wgmma_bf16<256>(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
      "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, "
      "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, "
      "%97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, "
      "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, %132, 1, 1, 1, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),
        "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
        "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),
        "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
        "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]),
        "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]),
        "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
        "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),
        "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// A scale or bias from its stored bits.
template <typename S>
__device__ __forceinline__ float scale_value(uint32_t bits) {
  if constexpr (std::is_same_v<S, float>)
    return __uint_as_float(bits);
  else if constexpr (std::is_same_v<S, __half>)
    return __half2float(__ushort_as_half((unsigned short)bits));
  else
    return __uint_as_float(bits << 16);
}

// Two values as bf16x2: lo in the low half (the lower k), each rounded once.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// mbarriers (shared::cta): init, arrive, arrive expecting TMA bytes, and a
// wait for a phase's parity.
__device__ __forceinline__ void barrier_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Arrives and expects `bytes` of TMA transactions before the phase completes.
__device__ __forceinline__ void barrier_expect(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void barrier_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// bf16 x2 helpers for the 4-bit codes with bf16 scales: 0x4300 | q is 128 + q.
__device__ __forceinline__ uint32_t bf16x2_sub(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t bf16x2_fma(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Where the GEMM's bf16 input takes element i of a row from: each 64-value
// tile of a 4-bit weight's input is permuted so that value 16 s + 8 h + 2 q + e
// sits where thread q's fragment takes it: x[64 t + 8 (2q + s / 2) + 2 (s % 2) + h + 4 e].
__device__ __forceinline__ int64_t input_source(int64_t i, int permute) {
  if (!permute) return i;
  const int l = int(i % kTileK), s = l / 16, h = l / 8 % 2, q = l / 2 % 4, e = l % 2;
  return i - l + 8 * (2 * q + s / 2) + 2 * (s % 2) + h + 4 * e;
}

// Where column o of a row lands in that order: input_source's inverse (o = 8
// (2q + s / 2) + 4 e + 2 (s % 2) + h within its tile lands at 16 s + 8 h + 2 q + e).
__device__ __forceinline__ int64_t input_position(int64_t o, int permute) {
  if (!permute) return o;
  const int c = int(o % kTileK), a = c / 8, e = c / 4 % 2, b = c / 2 % 2, h = c % 2;
  const int q = a / 2, s = 2 * (a % 2) + b;
  return o - c + 16 * s + 8 * h + 2 * q + e;
}

// Block: two warpgroups of 64 rows. Tiles stream into a ring of slots by TMA;
// full[slot] completes when a tile's bytes have landed, empty[slot] when both
// warpgroups' MMAs on it are done, so the warpgroups run apart and one's MMAs
// cover the other's fragment forming.
// Grid (token tiles, row tiles): the blocks sharing a weight tile run together,
// so its codes come from memory once and the other reads hit L2.
// The weights: MLX affine codes (kBits 4 or 8, S the scales' type), bf16
// values as stored (kBits 16), or FP8 E4M3 values with an f32 scale a 128 x 128
// block (kBits 8, S __nv_fp8_e4m3, kGroup 128; p.n_groups the blocks of a row).
template <int kBits, int kGroup, typename S, int kN, bool kOverlap, bool kGrouped, bool kSwiGlu = false>
__global__ void __launch_bounds__(kThreads, Layout<kBits, kN>::kBlocksPerSm)
    affine_gemm_kernel(const __grid_constant__ GemmProblem p) {
  static_assert(!kSwiGlu || kGrouped, "SwiGLU's epilogue is the grouped gate/up's");
  using L = Layout<kBits, kN>;
  constexpr bool kBf16Values = kBits == 16, kFp8 = std::is_same_v<S, __nv_fp8_e4m3>;
  static_assert(!kFp8 || (kBits == 8 && kGroup == 128), "FP8 weights: bytes, blocks of 128");
  constexpr int kStages = L::kStages;
  constexpr int kGroupsPerTile = kTileK / kGroup > 0 ? kTileK / kGroup : 1;  // 2, 1 or 1
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_address(smem_raw);
  const uint32_t base_addr = (raw_addr + 1023) & ~1023u;
  uint8_t* base = smem_raw + (base_addr - raw_addr);
  const uint32_t full_bar = base_addr + kStages * L::kStageBytes, empty_bar = full_bar + 8 * kStages;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // The block's first weight row (with SwiGLU: its first column of gate and of up).
  const int row0 = blockIdx.y * (kSwiGlu ? kRows / 2 : kRows);
  // Split-K: block z of p.splits takes its share of the k-tiles; kt counts them from k0.
  const int all_tiles = p.in / kTileK, k0 = int(blockIdx.z) * all_tiles / p.splits;
  const int n_tiles = (int(blockIdx.z) + 1) * all_tiles / p.splits - k0;
  if (tid == 0)
    for (int i = 0; i < kStages; ++i) {
      barrier_init(full_bar + 8 * i, 1);  // thread 0's arrival, then the loads' bytes
      barrier_init(empty_bar + 8 * i, kThreads / 32);  // each consumer warp
    }
  __syncthreads();
  // x comes from the previous kernel (the weights never change, but a slot holds both).
  allow_next_kernel();
  wait_for_previous_kernel();
  // The block's first token row, the rows past its own (n_end on), and where
  // its expert's weight rows start in the code map (grouped), else 0.
  int n0 = blockIdx.x * kN, n_end = p.T;
  int64_t expert_row = 0, up_expert_row = 0;
  if constexpr (kGrouped) {
    const int tile = blockIdx.x;
    if (tile >= p.tile_offsets[p.E]) return;  // the grid has a tile for every expert's partial one
    const int e = expert_of_tile(p.tile_offsets, p.E, tile);
    n0 = p.offsets[e] + (tile - p.tile_offsets[e]) * kN;
    n_end = p.offsets[e + 1];
    expert_row = int64_t(e) * p.expert_stride;
    if constexpr (kSwiGlu) up_expert_row = int64_t(e) * p.up_expert_stride;
  }

  // Thread 0 issues each tile's two loads (x and codes): tiles 0 to kStages - 3 first, then
  // tile kt + kStages - 2 at tile kt, into the slot of tile kt - 2 once both
  // warpgroups are done with it (the other may still be a tile behind).
  constexpr int kAhead = kStages - 2;
  auto load = [&](int kt) {
    const int slot = kt % kStages;
    if (kt >= kStages) barrier_wait(empty_bar + 8 * slot, (kt / kStages - 1) & 1);
    const uint32_t at = base_addr + slot * L::kStageBytes, bar = full_bar + 8 * slot;
    barrier_expect(bar, L::kTileBytes);
    tma_load(at, &p.x_map, (k0 + kt) * kTileK, n0, bar);
    if constexpr (kSwiGlu) {  // gate's 64 rows, then up's
      tma_load(at + L::kCodeAt, &p.code_map, (k0 + kt) * L::kCodeBytes, int(expert_row) + row0, bar);
      tma_load(at + L::kCodeAt + kRows / 2 * L::kCodeStride, &p.up_map, (k0 + kt) * L::kCodeBytes,
               int(up_expert_row) + row0, bar);
    } else {
      tma_load(at + L::kCodeAt, &p.code_map, (k0 + kt) * L::kCodeBytes, int(expert_row) + row0, bar);
    }
  };
  if (tid == 0)
    for (int kt = 0; kt < kAhead && kt < n_tiles; ++kt) load(kt);

  // Consumers: thread (g, q) of warp w % 4 in warpgroup w / 4 owns rows r_top and
  // r_top + 8 of the block.
  const int g = lane / 4, q = lane % 4;
  const int r_top = (warp / 4) * 64 + (warp % 4) * 16 + g, r_bottom = r_top + 8;
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;

  // The scales and biases of this thread's rows for a tile, as stored (16-bit
  // values in the low half, or f32 bits): [row][scale, bias][group]. Each
  // thread loads its own two tiles ahead (a row's few bytes a tile are too
  // small a box for the copy engine: loading them by TMA cost a third of the
  // time; a short block's tile can take less than a miss to L2).
  struct Scales {
    uint32_t v[2][2][kGroupsPerTile];
  };
  // With SwiGLU, warpgroup 1's rows are up's: its scales, biases and expert rows.
  const bool up_rows = kSwiGlu && warp >= 4;
  const void* scales = up_rows ? p.up_scales : p.scales;
  const void* biases = up_rows ? p.up_biases : p.biases;
  const int64_t my_expert_row = up_rows ? up_expert_row : expert_row;
  const int r_matrix = kSwiGlu ? r_top % 64 : r_top;  // r_top's row of its matrix, from row0
  const int64_t scale_row[2] = {(my_expert_row + min(row0 + r_matrix, p.out - 1)) * p.n_groups,
                                (my_expert_row + min(row0 + r_matrix + 8, p.out - 1)) * p.n_groups};
  // FP8: a block's rows share a scale row (the experts start whole blocks
  // apart, and 64 rows from a multiple of 64 lie in one block).
  const int64_t fp8_scale_row = (my_expert_row + row0) / 128 * p.n_groups;
  auto load_scales = [&](int kt) {
    Scales t{};
    const int first = (k0 + kt) * kTileK / kGroup;
    if constexpr (kFp8) {
      t.v[0][0][0] = t.v[1][0][0] = __ldg(static_cast<const unsigned int*>(scales) + fp8_scale_row + first);
    } else if constexpr (!kBf16Values) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr)
#pragma unroll
        for (int j = 0; j < kGroupsPerTile; ++j)
#pragma unroll
          for (int sb = 0; sb < 2; ++sb) {
            const int64_t i = scale_row[rr] + first + j;
            const void* src = sb ? biases : scales;
            t.v[rr][sb][j] = sizeof(S) == 2 ? uint32_t(__ldg(static_cast<const unsigned short*>(src) + i))
                                            : __ldg(static_cast<const unsigned int*>(src) + i);
          }
    }
    return t;
  };

  // A tile's scales and biases as f32 (the f32 forming paths).
  auto as_floats = [](const Scales& t, float (&sc)[2][kGroupsPerTile], float (&bi)[2][kGroupsPerTile]) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
#pragma unroll
      for (int j = 0; j < kGroupsPerTile; ++j)
        sc[rr][j] = scale_value<S>(t.v[rr][0][j]), bi[rr][j] = scale_value<S>(t.v[rr][1][j]);
  };

  // 8-bit values (int8 codes, FP8) of a tile, rows `codes`: step s's values
  // 16 s + 2q, + 1 are half q % 2 of word 4s + q / 2, and 8 further of word 4s
  // + 2 + q / 2. fn(s, rr, h, pair) forms a[s][2h + rr] from pair's low 16 bits.
  auto each_byte_pair = [&](const uint8_t* const (&codes)[2], auto&& fn) {
    const int shift = 16 * (q % 2);
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const uint4 w4 = *reinterpret_cast<const uint4*>(codes[rr] + 16 * s);
        const uint32_t words[2] = {(q < 2 ? w4.x : w4.y) >> shift, (q < 2 ? w4.z : w4.w) >> shift};
#pragma unroll
        for (int h = 0; h < 2; ++h) fn(s, rr, h, words[h]);
      }
  };

  // The weight fragments of tile kt for this thread, formed from the slot.
  auto form = [&](int kt, const Scales& t, uint32_t (&a)[4][4]) {
    const uint8_t* slot = base + (kt % kStages) * L::kStageBytes;
    const uint8_t* codes[2] = {slot + L::kCodeAt + r_top * L::kCodeStride,
                               slot + L::kCodeAt + r_bottom * L::kCodeStride};
    if constexpr (kBf16Values) {
      // Step s's fragment is four 8x8 matrices, (rows + 0 / + 8) x (values 16 s
      // + 0 / + 8), one ldmatrix: lane l gives row l % 8 of matrix l / 8. The
      // swizzle puts 16-byte chunk c of row r at c ^ (r % 8), so the 8 rows of a
      // matrix hit distinct banks.
      const int r = (warp / 4) * 64 + (warp % 4) * 16 + (lane / 8 % 2) * 8 + lane % 8, h = lane / 16;
      const uint32_t row_addr = base_addr + (kt % kStages) * L::kStageBytes + L::kCodeAt + r * L::kCodeStride;
#pragma unroll
      for (int s = 0; s < 4; ++s) ldmatrix_x4(a[s], row_addr + (((2 * s + h) ^ (r % 8)) << 4));
    } else if constexpr (kFp8) {
      // Laid out as 8-bit codes. Each value is exact in f32; times the block's
      // scale, rounded once to bf16.
      const float scale = __uint_as_float(t.v[0][0][0]);
      each_byte_pair(codes, [&](int s, int rr, int h, uint32_t pair) {
        const float2 v =
            __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair & 0xFFFFu), __NV_E4M3)));
        a[s][2 * h + rr] = pack_bf16x2(v.x * scale, v.y * scale);
      });
    } else if constexpr (kBits == 4) {
      // Words 2q and 2q + 1 of each row: word 2q + s / 2 gives step s its pairs
      // (i, i + 4), i = 2 (s % 2) + h, of nibbles (x is permuted to match).
      uint2 words[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) words[rr] = *reinterpret_cast<const uint2*>(codes[rr] + 8 * q);
      if constexpr (std::is_same_v<S, __nv_bfloat16>) {
        constexpr uint32_t k128 = 0x43004300u;  // bf16x2 (128, 128)
        uint32_t s2[2][kGroupsPerTile], b2[2][kGroupsPerTile];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
          for (int j = 0; j < kGroupsPerTile; ++j) {
            const uint32_t sw = t.v[rr][0][j], bw = t.v[rr][1][j];
            s2[rr][j] = sw | (sw << 16), b2[rr][j] = bw | (bw << 16);
          }
#pragma unroll
        for (int s = 0; s < 4; ++s)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
              const uint32_t w = s < 2 ? words[rr].x : words[rr].y;
              const int i = 2 * (s % 2) + h, j = kGroupsPerTile == 2 ? q / 2 : 0;  // words 2q, 2q + 1
              const uint32_t biased = ((w >> (4 * i)) & 0x000F000Fu) | k128;  // 128 + q, exact
              // scale * q + bias with one rounding (launch_affine_dequantize rounds
              // the f32 value, the same wherever that sum is exact in f32).
              a[s][2 * h + rr] = bf16x2_fma(bf16x2_sub(biased, k128), s2[rr][j], b2[rr][j]);
            }
      } else {
        float sc[2][kGroupsPerTile], bi[2][kGroupsPerTile];
        as_floats(t, sc, bi);
#pragma unroll
        for (int s = 0; s < 4; ++s)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
              const uint32_t w = (s < 2 ? words[rr].x : words[rr].y) >> (4 * (2 * (s % 2) + h));
              const int j = kGroupsPerTile == 2 ? q / 2 : 0;
              const float c0 = __uint_as_float((w & 0xFu) | kMagic) - kTwo23;
              const float c1 = __uint_as_float(((w >> 16) & 0xFu) | kMagic) - kTwo23;
              a[s][2 * h + rr] = pack_bf16x2(fmaf(sc[rr][j], c0, bi[rr][j]), fmaf(sc[rr][j], c1, bi[rr][j]));
            }
      }
    } else {
      float sc[2][kGroupsPerTile], bi[2][kGroupsPerTile];
      as_floats(t, sc, bi);
      each_byte_pair(codes, [&](int s, int rr, int h, uint32_t pair) {
        const int j = kGroupsPerTile == 2 ? s / 2 : 0;
        const float c0 = __uint_as_float(__byte_perm(pair, kMagic, 0x7440));
        const float c1 = __uint_as_float(__byte_perm(pair, kMagic, 0x7441));
        a[s][2 * h + rr] = pack_bf16x2(fmaf(sc[rr][j], c0 - kTwo23, bi[rr][j]), fmaf(sc[rr][j], c1 - kTwo23, bi[rr][j]));
      });
    }
  };

  if constexpr (kOverlap) {
    // Each warpgroup forms tile kt + 1's fragments while its MMAs on tile kt
    // run: two fragment buffers, the loop taken in pairs so that each step's
    // buffers are fixed registers (a buffer an in-flight MMA reads is never written).
    Scales next = load_scales(0), after = n_tiles > 1 ? load_scales(1) : next;
    uint32_t a0[4][4], a1[4][4];
    barrier_wait(full_bar, 0);
    form(0, next, a0);
    auto step = [&](int kt, const uint32_t (&a)[4][4], uint32_t (&a_next)[4][4]) {
      const int slot = kt % kStages;
      if (tid == 0 && kt + kAhead < n_tiles) load(kt + kAhead);
      const uint64_t desc = swizzled_descriptor(base_addr + slot * L::kStageBytes);
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < 4; ++s) wgmma_bf16<kN>(acc, a[s], desc + 2 * s);
      wgmma_commit();
      if (kt + 1 < n_tiles) {
        next = after;
        if (kt + 2 < n_tiles) after = load_scales(kt + 2);
        barrier_wait(full_bar + 8 * ((kt + 1) % kStages), ((kt + 1) / kStages) & 1);
        form(kt + 1, next, a_next);
      }
      wgmma_wait<0>();
      if (lane == 0) barrier_arrive(empty_bar + 8 * slot);
    };
    for (int kt = 0; kt < n_tiles; kt += 2) {
      step(kt, a0, a1);
      if (kt + 1 < n_tiles) step(kt + 1, a1, a0);
    }
  } else {
    Scales next = load_scales(0), after = n_tiles > 1 ? load_scales(1) : next;
    for (int kt = 0; kt < n_tiles; ++kt) {
      const int slot = kt % kStages;
      if (tid == 0 && kt + kAhead < n_tiles) load(kt + kAhead);
      const Scales now = next;
      next = after;
      if (kt + 2 < n_tiles) after = load_scales(kt + 2);
      barrier_wait(full_bar + 8 * slot, (kt / kStages) & 1);
      uint32_t a[4][4];
      form(kt, now, a);
      const uint64_t desc = swizzled_descriptor(base_addr + slot * L::kStageBytes);
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < 4; ++s) wgmma_bf16<kN>(acc, a[s], desc + 2 * s);  // + 32 bytes a step
      wgmma_commit();
      // Waiting here lets the other warpgroup's MMAs cover this one's next
      // fragments (one buffer: forming into it while the MMAs read it made
      // ptxas serialize them, C7513; the overlapped form above takes two).
      // (Making the warpgroups take turns with named barriers measured the same.)
      wgmma_wait<0>();
      if (lane == 0) barrier_arrive(empty_bar + 8 * slot);
    }
  }
  fence_accumulators(acc);

  if constexpr (kSwiGlu) {
    // Warpgroup 1 hands its up sums to warpgroup 0 through the ring, which
    // every MMA and load is done with: sum i of its thread w at [i][w], where
    // thread w of warpgroup 0 holds gate's sum of the same row and token.
    float* handed = reinterpret_cast<float*>(base);
    const int w = tid % 128;
    __syncthreads();
    if (warp >= 4) {
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) handed[i * 128 + w] = acc[i];
    }
    __syncthreads();
    if (warp >= 4) return;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = n0 + 8 * j + 2 * q + i % 2, o = row0 + (i < 2 ? r_top : r_bottom);
        if (t >= n_end || o >= p.out) continue;
        const float g = acc[4 * j + i], u = handed[(4 * j + i) * 128 + w];
        // silu(gate) * up in f32, as affine_grouped_swiglu_kernel forms it.
        p.act[int64_t(t) * p.out + input_position(o, p.act_permute)] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
      }
    return;
  }

  // acc[4j + i]: row r_top (i < 2) or r_bottom, token n0 + 8j + 2q + i % 2.
  const int o_top = row0 + r_top, o_bottom = row0 + r_bottom;
  const float bias_top = p.bias && o_top < p.out ? p.bias[o_top] : 0.0f;
  const float bias_bottom = p.bias && o_bottom < p.out ? p.bias[o_bottom] : 0.0f;
  // fn(sum, index into [T, out], bias) for each of this thread's results inside y.
  auto each_result = [&](auto&& fn) {
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = n0 + 8 * j + 2 * q + i % 2, o = i < 2 ? o_top : o_bottom;
        if (t < n_end && o < p.out) fn(acc[4 * j + i], int64_t(t) * p.out + o, i < 2 ? bias_top : bias_bottom);
      }
  };
  if (kGrouped || p.splits == 1) {
    each_result([&](float sum, int64_t at, float bias) { p.y[at] = sum + bias; });
    return;
  }
  if (p.splits == 2) {
    // Two halves add into y (zeroed first) by atomics, in either order as
    // 0 + a + b = 0 + b + a: deterministic. The slices below read slower at two
    // (o_proj at 16 and 64 tokens, fifty-eighth session, two H100 calls).
    each_result([&](float sum, int64_t at, float bias) {
      atomicAdd(p.y + at, sum + (blockIdx.z == 0 ? bias : 0.0f));
    });
    return;
  }
  // Three splits or more: each leaves its sums in its own slice of p.partials; the
  // last of a tile's splits to finish adds the slices in split order, so y
  // does not depend on which finished last.
  const int64_t slice = int64_t(p.T) * p.out;
  float* mine = p.partials + int64_t(blockIdx.z) * slice;
  each_result([&](float sum, int64_t at, float) { mine[at] = sum; });
  if (p.sum_apart) return;
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (tid == 0) last = atomicAdd(p.counters + blockIdx.y * gridDim.x + blockIdx.x, 1) == p.splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Coalesced: each thread takes 4 consecutive rows of a token at a time.
  const int rows = min(kRows, p.out - row0), tokens = min(kN, p.T - n0);
  const bool by_four = p.out % 4 == 0 && (reinterpret_cast<uintptr_t>(p.y) & 15) == 0;
  for (int idx = tid; idx < kN * (kRows / 4); idx += kThreads) {
    const int t = idx / (kRows / 4), r = idx % (kRows / 4) * 4;
    if (t >= tokens || r >= rows) continue;
    const int64_t at = int64_t(n0 + t) * p.out + row0 + r;
    float4 part[kMaxSplits];
#pragma unroll
    for (int z = 0; z < kMaxSplits; ++z) {
      if (z >= p.splits) break;
      const float* from = p.partials + z * slice + at;
      part[z] = by_four ? __ldcg(reinterpret_cast<const float4*>(from))
                        : make_float4(__ldcg(from), r + 1 < rows ? __ldcg(from + 1) : 0.0f,
                                      r + 2 < rows ? __ldcg(from + 2) : 0.0f, r + 3 < rows ? __ldcg(from + 3) : 0.0f);
    }
    float4 sum = part[0];
#pragma unroll
    for (int z = 1; z < kMaxSplits; ++z) {
      if (z >= p.splits) break;
      sum.x += part[z].x, sum.y += part[z].y, sum.z += part[z].z, sum.w += part[z].w;
    }
    const float* bias = p.bias ? p.bias + row0 + r : nullptr;
    if (by_four) {
      if (bias) sum.x += bias[0], sum.y += bias[1], sum.z += bias[2], sum.w += bias[3];
      *reinterpret_cast<float4*>(p.y + at) = sum;
    } else {
      const float v[4] = {sum.x, sum.y, sum.z, sum.w};
      for (int c = 0; c < 4 && r + c < rows; ++c) p.y[at + c] = v[c] + (bias ? bias[c] : 0.0f);
    }
  }
}

// Lever split_sum_kernel: y = the split sums' slices [splits, T, out] added in
// split order, + bias, as the last split's tail above adds them (the same
// bits), by a kernel over every SM. The tail is one block a tile (32 for
// Llama-3-8B's o_proj and down_proj at 256 tokens), each bound by the latency
// of its reads (ncu, sixty-seventh session). A thread takes 4 consecutive values.
__global__ void affine_gemm_sum_splits_kernel(const float* partials, int splits, int64_t T, int64_t out,
                                              const float* bias, float* y) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int64_t slice = T * out, at = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (at >= slice) return;
  if (out % 4 == 0 && (reinterpret_cast<uintptr_t>(y) & 15) == 0) {
    float4 part[kMaxSplits];
#pragma unroll
    for (int z = 0; z < kMaxSplits; ++z)
      if (z < splits) part[z] = __ldcg(reinterpret_cast<const float4*>(partials + z * slice + at));
    float4 sum = part[0];
#pragma unroll
    for (int z = 1; z < kMaxSplits; ++z)
      if (z < splits) sum.x += part[z].x, sum.y += part[z].y, sum.z += part[z].z, sum.w += part[z].w;
    if (bias) {
      const int64_t o = at % out;
      sum.x += bias[o], sum.y += bias[o + 1], sum.z += bias[o + 2], sum.w += bias[o + 3];
    }
    *reinterpret_cast<float4*>(y + at) = sum;
    return;
  }
  for (int64_t i = at; i < min(at + 4, slice); ++i) {
    float sum = __ldcg(partials + i);
    for (int z = 1; z < splits; ++z) sum += __ldcg(partials + z * slice + i);
    y[i] = sum + (bias ? bias[i % out] : 0.0f);
  }
}

// x [T, in] f32 -> bf16 (input_source's order). It also zeroes the GEMM's
// split counters (n_counters of them).
__global__ void affine_gemm_input_kernel(const float* x, __nv_bfloat16* out, int64_t n, int permute, int* counters,
                                         int n_counters) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n_counters) counters[i] = 0;
  if (i >= n) return;
  out[i] = __float2bfloat16(x[input_source(i, permute)]);
}

// Eight values of a row as bf16 in input_source's order: value(i) for i = c
// .. c + 7 (c a multiple of 8, so the eight lie in one tile of 64).
template <typename Value>
__device__ __forceinline__ uint4 bf16_chunk(int64_t c, int permute, Value&& value) {
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = value(input_source(c + j, permute));
  return make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]),
                    pack_bf16x2(v[6], v[7]));
}

// The grouped GEMM's x: row r of P (a block a row) is token sorted_pair[r] /
// k's row of x [T, in] f32, as bf16 in input_source's order; a thread forms 8
// values at a time into one 16-byte store. (One value a thread, with a 64-bit
// division each, took 161 us at Qwen3-30B-A3B's 2,048-token chunk, 11% of
// the prefill.)
__global__ void affine_grouped_input_kernel(const float* x, const int32_t* sorted_pair, int k, int64_t in,
                                            int permute, __nv_bfloat16* out) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int64_t r = blockIdx.x;
  const float* row = x + int64_t(sorted_pair[r] / k) * in;
  uint4* dst = reinterpret_cast<uint4*>(out + r * in);
  for (int64_t c = 8 * threadIdx.x; c < in; c += 8 * blockDim.x)
    dst[c / 8] = bf16_chunk(c, permute, [&](int64_t i) { return row[i]; });
}

// The grouped down GEMM's x: silu(gate) * up of [P, f] f32 each (in f32, as the
// bf16 GEMM's epilogue forms it), as bf16 in input_source's order; a block a row.
__global__ void affine_grouped_swiglu_kernel(const float* gate, const float* up, int64_t f, int permute,
                                             __nv_bfloat16* out) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int64_t r = blockIdx.x;
  const float *g_row = gate + r * f, *u_row = up + r * f;
  uint4* dst = reinterpret_cast<uint4*>(out + r * f);
  for (int64_t c = 8 * threadIdx.x; c < f; c += 8 * blockDim.x)
    dst[c / 8] = bf16_chunk(c, permute, [&](int64_t i) {
      const float g = g_row[i];
      return g / (1.0f + __expf(-g)) * u_row[i];
    });
}

template <typename Fn>
cudaError_t visit_gemm(const AffineArgs& w, Fn&& fn) {
  auto with_scale = [&]<int kBits, int kGroup>() {
    switch (w.scale_dtype) {
      case DType::bf16: fn.template operator()<kBits, kGroup, __nv_bfloat16>(); return cudaSuccess;
      case DType::f16: fn.template operator()<kBits, kGroup, __half>(); return cudaSuccess;
      case DType::f32: fn.template operator()<kBits, kGroup, float>(); return cudaSuccess;
      default: return cudaErrorInvalidValue;
    }
  };
  auto with_group = [&]<int kBits>() {
    switch (w.group_size) {
      case 32: return with_scale.template operator()<kBits, 32>();
      case 64: return with_scale.template operator()<kBits, 64>();
      case 128: return with_scale.template operator()<kBits, 128>();
      default: return cudaErrorInvalidValue;
    }
  };
  if (w.bits == 4) return with_group.template operator()<4>();
  if (w.bits == 8) return with_group.template operator()<8>();
  return cudaErrorInvalidValue;
}

// The fewest tokens a block (32, 64 or 128) that cover a short input (the MMAs
// past T are wasted work), else 256, whose MMAs cover the forming of the
// fragments twice as well as 128's (0.61-0.68 of bf16 against 0.53-0.64 at 4096
// tokens, H200). Where the grid holds fewer blocks than the SMs take at once
// (Llama-3-8B's o_proj and down_proj: 32 row tiles; q/k/v: 48), the k-tiles
// split into as many ranges as fill them, up to 8 and at least 8 tiles each:
// at 16 tokens a 32-block grid had streamed on a quarter of the SMs.
constexpr int kMinTilesPerSplit = 8;

AffineGemmPlan plan_for(const AffineArgs& w, int64_t T, AffineGemmPlan hint) {
  AffineGemmPlan plan = hint;
  if (!plan.tokens) plan.tokens = T <= 32 ? 32 : T <= 64 ? 64 : T <= 128 ? 128 : 256;
  if (!plan.splits) {
    const int64_t slots = sm_count() * (plan.tokens == 256 ? 1 : 2);  // Layout::kBlocksPerSm
    const int64_t blocks = (w.out + kRows - 1) / kRows * ((T + plan.tokens - 1) / plan.tokens);
    const int64_t most = std::max<int64_t>(1, std::min<int64_t>(kMaxSplits, w.in / kTileK / kMinTilesPerSplit));
    plan.splits = int(std::clamp<int64_t>(slots / blocks, 1, most));
  }
  return plan;
}

// Where the split sums and their counters lie in the scratch, after x's bf16 copy.
struct ScratchLayout {
  int64_t partials_at, counters_at, bytes;
  int n_counters;
};
ScratchLayout scratch_layout(const AffineArgs& w, int64_t T, const AffineGemmPlan& plan) {
  ScratchLayout s{};
  s.partials_at = (T * w.in * 2 + 15) / 16 * 16;
  const bool sliced = plan.splits > 2;  // two splits add into y by atomics
  const int64_t partials = sliced ? int64_t(plan.splits) * T * w.out * 4 : 0;
  s.counters_at = s.partials_at + partials;
  s.n_counters = sliced ? int((T + plan.tokens - 1) / plan.tokens * ((w.out + kRows - 1) / kRows)) : 0;
  s.bytes = s.counters_at + int64_t(s.n_counters) * 4;
  return s;
}

// The driver's cuTensorMapEncodeTiled, looked up once through the runtime (no
// link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A 2-D map of rows of `row_bytes` (inner dimension `inner` elements of `dtype`).
bool make_map(CUtensorMap* map, const void* base, CUtensorMapDataType dtype, uint64_t inner, uint64_t rows,
              uint64_t row_bytes, uint32_t box_inner, uint32_t box_rows, CUtensorMapSwizzle swizzle) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled();
  if (!encode) return false;
  const cuuint64_t dims[2] = {inner, rows}, strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_inner, box_rows}, element_strides[2] = {1, 1};
  return encode(map, dtype, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Launches the kernel of kN = `tokens` rows a block over `grid`: the
// overlapped loop where it was measured faster (fifty-eighth and fifty-ninth
// sessions, docs/benchmarks.md): int4 at 32 tokens with bf16 scales or f16 in
// groups of 64 or 128 (+11-27% at 16 and 32 sequences), and at 64 tokens with
// bf16 scales in groups of 64 or 128 (pp64 +18-26%); int8 at 32 tokens in
// groups of 128 (+18-27%, bf16 and f16 scales; the plain loop ran them 20%
// slower than groups of 64). Level or 1-4% slower: int4 f16 g32, int4 g32 or
// f16 at 64 tokens, int8 g32 and g64; 7-15% slower at 256-token blocks.
template <int kBits, int kGroup, typename S, bool kGrouped, bool kSwiGlu = false>
cudaError_t launch_gemm_kernel(int tokens, dim3 grid, const GemmProblem& p, cudaStream_t stream) {
  cudaError_t status = cudaSuccess;
  auto run = [&]<int kN>() {
    constexpr bool kBf16 = std::is_same_v<S, __nv_bfloat16>;
    constexpr bool kOverlap = sizeof(S) == 2 && ((kBits == 4 && kN == 32 && (kBf16 || kGroup >= 64)) ||
                                                 (kBits == 4 && kN == 64 && kBf16 && kGroup >= 64) ||
                                                 (kBits == 8 && kN == 32 && kGroup == 128));
    auto* kernel = affine_gemm_kernel<kBits, kGroup, S, kN, kOverlap, kGrouped, kSwiGlu>;
    constexpr int bytes = Layout<kBits, kN>::kSharedBytes;
    // Once per kernel (one GPU a process): more than the default 48 KB of shared memory.
    static const cudaError_t allowed = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if ((status = allowed) != cudaSuccess) return;
    status = launch_kernel(kernel, grid, dim3(kThreads), size_t(bytes), stream, p);
  };
  switch (tokens) {
    case 32: run.template operator()<32>(); break;
    case 64: run.template operator()<64>(); break;
    case 128: run.template operator()<128>(); break;
    default:
      if constexpr (kGrouped) status = cudaErrorInvalidValue;  // grouped blocks take up to 128 tokens
      else run.template operator()<256>();
  }
  return status;
}

}  // namespace

bool affine_gemm_supports(const AffineArgs& w, int64_t T) {
  const int scale_bytes = w.scale_dtype == DType::f32 ? 4 : 2;
  auto aligned = [](const void* p, int n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  return (w.bits == 4 || w.bits == 8) && (w.group_size == 32 || w.group_size == 64 || w.group_size == 128) &&
         T > 0 && T < (int64_t(1) << 31) && w.out > 0 && (w.out + kRows - 1) / kRows <= 65535 &&  // grid.y
         w.in % kTileK == 0 &&
         w.in % w.group_size == 0 && aligned(w.packed, 16) && aligned(w.scales, scale_bytes) &&
         aligned(w.biases, scale_bytes) && encode_tiled() != nullptr;  // a driver that makes TMA maps
}

int64_t affine_gemm_scratch_bytes(const AffineArgs& w, int64_t T, AffineGemmPlan plan) {
  return scratch_layout(w, T, plan_for(w, T, plan)).bytes;
}

namespace {
// The GEMM over MLX affine codes (fp8 false) or FP8 values (w as fp8_args
// makes it), the shapes checked by the caller.
cudaError_t run_gemm(const AffineArgs& w, bool fp8, const float* x, void* scratch, const float* bias, float* y,
                     int64_t T, cudaStream_t stream, AffineGemmPlan hint) {
  if (reinterpret_cast<uintptr_t>(scratch) % 16) return cudaErrorInvalidValue;
  if ((hint.tokens != 0 && hint.tokens != 32 && hint.tokens != 64 && hint.tokens != 128 && hint.tokens != 256) ||
      hint.splits < 0 || hint.splits > kMaxSplits || hint.splits > w.in / kTileK)
    return cudaErrorInvalidValue;
  const AffineGemmPlan plan = plan_for(w, T, hint);
  const ScratchLayout layout = scratch_layout(w, T, plan);
  auto* x_bf16 = static_cast<__nv_bfloat16*>(scratch);
  int* counters = reinterpret_cast<int*>(static_cast<uint8_t*>(scratch) + layout.counters_at);
  const int64_t n_x = T * w.in, n_threads = std::max<int64_t>(n_x, layout.n_counters);
  cudaError_t status = launch_kernel(affine_gemm_input_kernel, dim3(unsigned((n_threads + 255) / 256)), dim3(256), 0,
                                     stream, x, x_bf16, n_x, int(w.bits == 4), counters, layout.n_counters);
  if (status != cudaSuccess) return status;
  if (plan.splits == 2 && (status = cudaMemsetAsync(y, 0, size_t(T * w.out) * sizeof(float), stream)) != cudaSuccess)
    return status;
  const int n = plan.tokens;
  const uint64_t row_bytes = uint64_t(w.in) * w.bits / 8;
  GemmProblem p{};
  p.scales = w.scales, p.biases = w.biases, p.splits = plan.splits;
  p.n_groups = int(fp8 ? (w.in + 127) / 128 : w.in / w.group_size);  // FP8: the scale blocks of a row
  p.partials = reinterpret_cast<float*>(static_cast<uint8_t*>(scratch) + layout.partials_at), p.counters = counters;
  p.bias = bias, p.y = y, p.T = int(T), p.in = int(w.in), p.out = int(w.out);
  const bool mapped =
      make_map(&p.x_map, x_bf16, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, uint64_t(w.in), uint64_t(T), uint64_t(w.in) * 2,
               kTileK, uint32_t(n), CU_TENSOR_MAP_SWIZZLE_128B) &&
      make_map(&p.code_map, w.packed, CU_TENSOR_MAP_DATA_TYPE_UINT8, row_bytes, uint64_t(w.out), row_bytes,
               uint32_t(kTileK * w.bits / 8), kRows, CU_TENSOR_MAP_SWIZZLE_NONE);
  if (!mapped) return cudaErrorInvalidValue;
  const dim3 grid(unsigned((T + n - 1) / n), unsigned((w.out + kRows - 1) / kRows), unsigned(plan.splits));
  p.sum_apart = plan.splits > 2 && split_sum_kernel_enabled();
  if (fp8) {
    status = launch_gemm_kernel<8, 128, __nv_fp8_e4m3, false>(n, grid, p, stream);
  } else {
    const cudaError_t dispatch = visit_gemm(w, [&]<int kBits, int kGroup, typename S>() {
      status = launch_gemm_kernel<kBits, kGroup, S, false>(n, grid, p, stream);
    });
    if (dispatch != cudaSuccess) return dispatch;
  }
  if (status != cudaSuccess || !p.sum_apart) return status;
  const int64_t quads = (T * w.out + 3) / 4;
  return launch_kernel(affine_gemm_sum_splits_kernel, dim3(unsigned((quads + 255) / 256)), dim3(256), 0, stream,
                       static_cast<const float*>(p.partials), plan.splits, T, w.out, bias, y);
}

// An FP8 weight as the GEMM takes it: its values as 8-bit codes, its block scales.
AffineArgs fp8_args(const Fp8WeightView& w) {
  return {.packed = reinterpret_cast<const uint32_t*>(w.values), .scales = w.scale_inv, .biases = nullptr,
          .scale_dtype = DType::f32, .bits = 8, .group_size = 128, .in = w.in, .out = w.out};
}
}  // namespace

cudaError_t launch_affine_gemm(const AffineArgs& w, const float* x, void* scratch, const float* bias, float* y,
                               int64_t T, cudaStream_t stream, AffineGemmPlan hint) {
  if (!affine_gemm_supports(w, T)) return cudaErrorInvalidValue;
  return run_gemm(w, false, x, scratch, bias, y, T, stream, hint);
}

bool fp8_dequantizing_gemm_supports(const Fp8WeightView& w, int64_t T) {
  return w.block == 128 && w.scale_cols == (w.in + 127) / 128 && T > 0 && T < (int64_t(1) << 31) && w.out > 0 &&
         (w.out + kRows - 1) / kRows <= 65535 && w.in % kTileK == 0 &&
         reinterpret_cast<uintptr_t>(w.values) % 16 == 0 && w.scale_inv != nullptr &&
         reinterpret_cast<uintptr_t>(w.scale_inv) % 4 == 0 && encode_tiled() != nullptr;
}

int64_t fp8_dequantizing_gemm_scratch_bytes(const Fp8WeightView& w, int64_t T, AffineGemmPlan plan) {
  const AffineArgs a = fp8_args(w);
  return scratch_layout(a, T, plan_for(a, T, plan)).bytes;
}

cudaError_t launch_fp8_dequantizing_gemm(const Fp8WeightView& w, const float* x, void* scratch, const float* bias,
                                         float* y, int64_t T, cudaStream_t stream, AffineGemmPlan plan) {
  if (!fp8_dequantizing_gemm_supports(w, T)) return cudaErrorInvalidValue;
  return run_gemm(fp8_args(w), true, x, scratch, bias, y, T, stream, plan);
}

namespace {
// Bits a weight value takes in the code map: 16 for bf16 values, 8 for FP8's.
int value_bits(const AffineGroupedGemm& g) {
  return g.kind == GroupedWeights::bf16 ? 16 : g.kind == GroupedWeights::fp8 ? 8 : g.w.bits;
}
// A block of up to 256 threads a row of `in` values, 8 a thread.
dim3 row_block(int64_t in) { return dim3(unsigned(std::min<int64_t>(256, (in / 8 + 31) / 32 * 32))); }
}  // namespace

bool affine_grouped_gemm_supports(const AffineGroupedGemm& g) {
  const AffineArgs& w = g.w;
  const bool shapes = g.E > 0 && g.expert_stride >= w.out && w.out > 0 && g.P > 0 && g.P < (int64_t(1) << 31) &&
                      (w.out + kRows - 1) / kRows <= 65535 &&  // grid.y
                      (int64_t(g.E) - 1) * g.expert_stride + w.out < (int64_t(1) << 31) &&  // the code map's rows
                      (g.tokens == 32 || g.tokens == 64 || g.tokens == 128);
  if (!shapes) return false;
  if (g.kind == GroupedWeights::affine) return affine_gemm_supports(w, g.P);
  const bool aligned = reinterpret_cast<uintptr_t>(w.packed) % 16 == 0 && encode_tiled() != nullptr;
  if (g.kind == GroupedWeights::bf16) return aligned && w.in % kTileK == 0;
  return aligned && w.in % kTileK == 0 && g.expert_stride % 128 == 0 && w.scales != nullptr &&
         reinterpret_cast<uintptr_t>(w.scales) % 4 == 0;
}

cudaError_t launch_affine_grouped_input(const float* x, const int32_t* sorted_pair, int64_t k, int64_t P, int64_t in,
                                        int bits, void* x_bf16, cudaStream_t stream) {
  if (P == 0 || in == 0) return cudaSuccess;
  if (in % 8 || P >= (int64_t(1) << 31)) return cudaErrorInvalidValue;
  return launch_kernel(affine_grouped_input_kernel, dim3(unsigned(P)), row_block(in), 0, stream, x, sorted_pair,
                       int(k), in, int(bits == 4), static_cast<__nv_bfloat16*>(x_bf16));
}

cudaError_t launch_affine_grouped_swiglu(const float* gate, const float* up, int64_t P, int64_t f, int bits,
                                         void* act_bf16, cudaStream_t stream) {
  if (P == 0 || f == 0) return cudaSuccess;
  if (f % 8 || P >= (int64_t(1) << 31)) return cudaErrorInvalidValue;
  return launch_kernel(affine_grouped_swiglu_kernel, dim3(unsigned(P)), row_block(f), 0, stream, gate, up, f,
                       int(bits == 4), static_cast<__nv_bfloat16*>(act_bf16));
}

namespace {
// The grouped problem of g (its maps with boxes of box_rows weight rows) and its grid.
bool grouped_problem(const AffineGroupedGemm& g, int box_rows, GemmProblem& p, CUtensorMap& code_map) {
  const AffineArgs& w = g.w;
  const int bits = value_bits(g);
  const uint64_t row_bytes = uint64_t(w.in) * bits / 8;
  p.scales = w.scales, p.biases = w.biases, p.splits = 1;
  p.n_groups = int(g.kind == GroupedWeights::fp8 ? (w.in + 127) / 128 : g.kind == GroupedWeights::affine ? w.in / w.group_size : 0);
  p.y = g.y, p.T = int(g.P), p.in = int(w.in), p.out = int(w.out);
  p.offsets = g.offsets, p.tile_offsets = g.tile_offsets, p.E = g.E, p.expert_stride = int(g.expert_stride);
  const uint64_t code_rows = uint64_t(g.E - 1) * uint64_t(g.expert_stride) + uint64_t(w.out);
  // bf16 rows of 128 bytes a tile arrive in the swizzle ldmatrix reads without conflicts.
  return make_map(&p.x_map, g.x_bf16, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, uint64_t(w.in), uint64_t(g.P),
                  uint64_t(w.in) * 2, kTileK, uint32_t(g.tokens), CU_TENSOR_MAP_SWIZZLE_128B) &&
         make_map(&code_map, w.packed, CU_TENSOR_MAP_DATA_TYPE_UINT8, row_bytes, code_rows, row_bytes,
                  uint32_t(kTileK * bits / 8), uint32_t(box_rows),
                  bits == 16 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE);
}

// A token tile for each whole tile of pairs and each expert's partial one; the blocks past
// tile_offsets[E] end at once.
unsigned grouped_tiles(const AffineGroupedGemm& g) { return unsigned((g.P + g.tokens - 1) / g.tokens + g.E); }

// Calls fn.template operator()<kBits, kGroup, S>() for g's weights.
template <typename Fn>
cudaError_t visit_grouped(const AffineGroupedGemm& g, Fn&& fn) {
  if (g.kind == GroupedWeights::bf16) return fn.template operator()<16, 64, __nv_bfloat16>();
  if (g.kind == GroupedWeights::fp8) return fn.template operator()<8, 128, __nv_fp8_e4m3>();
  cudaError_t status = cudaSuccess;
  const cudaError_t dispatch = visit_gemm(g.w, [&]<int kBits, int kGroup, typename S>() {
    status = fn.template operator()<kBits, kGroup, S>();
  });
  return dispatch != cudaSuccess ? dispatch : status;
}
}  // namespace

cudaError_t launch_affine_grouped_gemm(const AffineGroupedGemm& g, cudaStream_t stream) {
  if (g.P == 0) return cudaSuccess;
  if (!affine_grouped_gemm_supports(g) || reinterpret_cast<uintptr_t>(g.x_bf16) % 16) return cudaErrorInvalidValue;
  GemmProblem p{};
  if (!grouped_problem(g, kRows, p, p.code_map)) return cudaErrorInvalidValue;
  const dim3 grid(grouped_tiles(g), unsigned((g.w.out + kRows - 1) / kRows));
  return visit_grouped(g, [&]<int kBits, int kGroup, typename S>() {
    return launch_gemm_kernel<kBits, kGroup, S, true>(g.tokens, grid, p, stream);
  });
}

bool affine_grouped_swiglu_gemm_supports(const AffineGroupedGemm& gate, const AffineGroupedGemm& up) {
  const AffineArgs &a = gate.w, &b = up.w;
  return affine_grouped_gemm_supports(gate) && affine_grouped_gemm_supports(up) && gate.kind == up.kind &&
         a.bits == b.bits && a.group_size == b.group_size && a.scale_dtype == b.scale_dtype && a.in == b.in &&
         a.out == b.out && a.out % (kRows / 2) == 0 && gate.E == up.E && gate.P == up.P && gate.tokens == up.tokens;
}

cudaError_t launch_affine_grouped_swiglu_gemm(const AffineGroupedGemm& gate, const AffineGroupedGemm& up,
                                              int down_bits, void* act_bf16, cudaStream_t stream) {
  if (gate.P == 0) return cudaSuccess;
  if (!affine_grouped_swiglu_gemm_supports(gate, up) || reinterpret_cast<uintptr_t>(gate.x_bf16) % 16)
    return cudaErrorInvalidValue;
  GemmProblem p{}, q{};
  if (!grouped_problem(gate, kRows / 2, p, p.code_map) || !grouped_problem(up, kRows / 2, q, p.up_map))
    return cudaErrorInvalidValue;
  p.up_scales = up.w.scales, p.up_biases = up.w.biases, p.up_expert_stride = int(up.expert_stride);
  p.act = static_cast<__nv_bfloat16*>(act_bf16), p.act_permute = int(down_bits == 4), p.y = nullptr;
  const dim3 grid(grouped_tiles(gate), unsigned(gate.w.out / (kRows / 2)));
  return visit_grouped(gate, [&]<int kBits, int kGroup, typename S>() {
    return launch_gemm_kernel<kBits, kGroup, S, true, true>(gate.tokens, grid, p, stream);
  });
}

}  // namespace mere::cuda
