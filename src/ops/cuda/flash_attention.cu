// Causal GQA attention for prefill on the tensor cores, in the manner of
// FlashAttention-2 (Dao, 2023, algorithm 1 with the row blocks split over warps).
// One block takes BM consecutive tokens of one query head; each of its warps owns
// 16 * MT of those rows. The block walks the visible keys in tiles of BN rows: K
// and V tiles are copied into shared memory with cp.async, the next tile while
// the current one is used. A warp computes S = Q K^T with mma.sync m16n8k16
// (bf16 in, f32 out), updates its online softmax in f32, and adds P V into its
// f32 output registers, P going from the S accumulators straight into A
// fragments. Q is scaled by scale * log2(e) and rounded to bf16 once, so the
// softmax uses exp2. Tiles past a warp's last row are skipped; tiles that cross
// the diagonal are masked. Query heads of one kv group are neighbouring blocks,
// so they read the same K/V from L2, and the heaviest row blocks (the last
// tokens) start first.
//
// Shared memory rows are HD bf16 (8 to 32 chunks of 16 bytes); chunk c of row r
// sits at chunk c ^ (r % 8), so the 8 rows an ldmatrix reads hit 8 different
// bank groups.
#include <cstdint>
#include <utility>

#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

struct FlashArgs {
  const float* q;  // [T, n_heads, HD]
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;  // [>= visible keys, n_kv_heads, HD]
  float* out;              // [T, n_heads, HD]
  int T, n_heads, n_kv_heads;
  const int32_t* pos_dev;
  int64_t pos0;
  float q_scale;  // scale * log2(e)
};

// Sizes of a FlashAttentionTile: NW warps of 16 * MT query rows, BN keys per
// tile; Q's fragments are held in registers (QREG) or read again from shared
// memory for every tile.
template <int HD, int NW, int MT, int BN, bool QREG>
struct Tile {
  static constexpr int kThreads = NW * 32;
  static constexpr int kWarpRows = 16 * MT;
  static constexpr int BM = NW * kWarpRows;
  static constexpr int kChunks = HD / 8;       // 16-byte chunks per row
  static constexpr int kKvElems = BN * HD;     // one K or V tile
  // Stages: [K0][V0][K1][V1]. Q held in registers only passes through shared
  // memory at the start, so it borrows stage 1 (filled only after Q is read).
  static constexpr int kQOffset = QREG ? 2 * kKvElems : 4 * kKvElems;
  static constexpr int kSmemElems =
      QREG ? 2 * kKvElems + (2 * kKvElems > BM * HD ? 2 * kKvElems : BM * HD) : 4 * kKvElems + BM * HD;
  static constexpr size_t kSmemBytes = size_t(kSmemElems) * 2;
  static_assert(HD % 64 == 0 && BN % 16 == 0);
  static_assert((BN * kChunks) % kThreads == 0, "K/V tile copies must divide evenly over the threads");
};

// Element offset of chunk `chunk` (8 elements) of row `row` in a swizzled tile.
template <int HD>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * HD + ((chunk ^ (row & 7)) << 3);
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a b for a 16x16 (row-major) by 16x8 (column-major) bf16 product in f32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as bf16 in one word, the first in the low half (the lower address).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float exp2_approx(float x) {  // exp2(-inf) = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Fragment layouts (PTX ISA, mma.m16n8k16): lane = 4 g + c. A (16x16): rows g and
// g + 8, columns 2c, 2c + 1 and those + 8, in four words. B (16x8): rows 2c, 2c + 1
// (+ 8) of column g, in two words. The accumulator: rows g and g + 8, columns 2c,
// 2c + 1, in elements {0, 1} and {2, 3}.
template <int HD, int NW, int MT, int BN, bool QREG, int MIN_BLOCKS>
__global__ void __launch_bounds__(NW * 32, MIN_BLOCKS) flash_attention_kernel(FlashArgs a) {
  using C = Tile<HD, NW, MT, BN, QREG>;
  constexpr int BM = C::BM, kChunks = C::kChunks, kThreads = C::kThreads;
  extern __shared__ __align__(128) uint16_t smem[];  // bf16 bits
  allow_next_kernel();
  wait_for_previous_kernel();

  const int h = blockIdx.x, kv_h = h / (a.n_heads / a.n_kv_heads);
  const int m0 = (gridDim.y - 1 - blockIdx.y) * BM;  // the heaviest row blocks first
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int pos0 = int(a.pos_dev ? *a.pos_dev : a.pos0);
  const int rows = min(BM, a.T - m0);
  const int kv_end = pos0 + m0 + rows;  // keys the block's last token sees, exclusive
  const int n_tiles = (kv_end + BN - 1) / BN;

  // Keys [key0, key0 + BN) of K and V into a stage; rows past kv_end are zeros,
  // so masked columns multiply finite values.
  const int64_t row_stride = int64_t(a.n_kv_heads) * HD;
  const __nv_bfloat16* k_head = a.k + int64_t(kv_h) * HD;
  const __nv_bfloat16* v_head = a.v + int64_t(kv_h) * HD;
  auto load_kv = [&](int tile, int stage) {
    uint16_t* ks = smem + stage * 2 * C::kKvElems;
    uint16_t* vs = ks + C::kKvElems;
#pragma unroll
    for (int it = 0; it < BN * kChunks / kThreads; ++it) {
      const int i = threadIdx.x + it * kThreads;
      const int r = i / kChunks, ch = i % kChunks, key = tile * BN + r;
      const bool valid = key < kv_end;
      const int64_t offset = (valid ? key : 0) * row_stride + ch * 8;
      const int s = swizzled<HD>(r, ch);
      copy_async_16(smem_address(ks + s), k_head + offset, valid);
      copy_async_16(smem_address(vs + s), v_head + offset, valid);
    }
  };
  load_kv(0, 0);
  copy_async_commit();

  // Q rows, scaled and rounded to bf16; rows past T are zeros.
  uint16_t* qs = smem + C::kQOffset;
#pragma unroll
  for (int it = 0; it < BM * kChunks / kThreads; ++it) {
    const int i = threadIdx.x + it * kThreads;
    const int r = i / kChunks, ch = i % kChunks;
    uint4 packed = make_uint4(0, 0, 0, 0);
    if (r < rows) {
      const float4* src = reinterpret_cast<const float4*>(a.q + (int64_t(m0 + r) * a.n_heads + h) * HD + ch * 8);
      const float4 x0 = src[0], x1 = src[1];
      const float s = a.q_scale;
      packed = make_uint4(pack_bf16(x0.x * s, x0.y * s), pack_bf16(x0.z * s, x0.w * s), pack_bf16(x1.x * s, x1.y * s),
                          pack_bf16(x1.z * s, x1.w * s));
    }
    *reinterpret_cast<uint4*>(qs + swizzled<HD>(r, ch)) = packed;
  }
  __syncthreads();

  const int warp_row0 = warp * C::kWarpRows;  // within the block
  // A fragments of Q for rows warp_row0 + 16 mt .. + 15, dims 16 kk .. + 15.
  auto load_q = [&](uint32_t (&f)[4], int mt, int kk) {
    ldmatrix_x4(f, smem_address(qs + swizzled<HD>(warp_row0 + mt * 16 + lane % 16, kk * 2 + lane / 16)));
  };
  uint32_t q_frag[QREG ? MT : 1][QREG ? HD / 16 : 1][4];
  if constexpr (QREG) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) load_q(q_frag[mt][kk], mt, kk);
    __syncthreads();  // Q leaves stage 1 before tile 1 lands there
  }

  float o[MT][HD / 8][4];
  float row_max[MT][2], row_sum[MT][2];  // row_sum: this thread's columns only
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0;
  }

  // The warp's tokens; a warp wholly past T has nothing to do.
  const int warp_first = m0 + warp_row0, warp_last = min(m0 + warp_row0 + C::kWarpRows, a.T) - 1;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int stage = tile & 1;
    if (tile + 1 < n_tiles) load_kv(tile + 1, stage ^ 1);
    copy_async_commit();  // possibly empty, so that "all but the newest group" is this tile
    copy_async_wait<1>();
    __syncthreads();

    const int key0 = tile * BN;
    if (warp_first <= warp_last && key0 <= pos0 + warp_last) {
      const uint16_t* ks = smem + stage * 2 * C::kKvElems;
      const uint16_t* vs = ks + C::kKvElems;

      float s[MT][BN / 8][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        uint32_t qa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (QREG) {
#pragma unroll
            for (int i = 0; i < 4; ++i) qa[mt][i] = q_frag[mt][kk][i];
          } else {
            load_q(qa[mt], mt, kk);
          }
        }
#pragma unroll
        for (int jj = 0; jj < BN / 16; ++jj) {
          // Matrices: keys +0..7 then +8..15, each dims 16 kk + 0..7 then + 8..15.
          uint32_t b[4];
          ldmatrix_x4(b, smem_address(ks + swizzled<HD>(jj * 16 + (lane / 16) * 8 + lane % 8, kk * 2 + (lane / 8) % 2)));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(s[mt][2 * jj], qa[mt], b[0], b[1]);
            mma_bf16(s[mt][2 * jj + 1], qa[mt], b[2], b[3]);
          }
        }
      }

      // Token m0 + row sees keys up to pos0 + m0 + row.
      if (key0 + BN - 1 > pos0 + warp_first) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int last_key = pos0 + warp_first + mt * 16 + g + (e / 2) * 8;
              if (key0 + j * 8 + 2 * c + e % 2 > last_key) s[mt][j][e] = -INFINITY;
            }
      }

      // Online softmax: the four lanes of a quad hold one row between them.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          float mx = row_max[mt][hr];
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * hr], s[mt][j][2 * hr + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float ref = mx == -INFINITY ? 0.0f : mx;  // no key yet: every weight is exp2(-inf) = 0
          const float correction = exp2_approx(row_max[mt][hr] - ref);
          row_max[mt][hr] = mx;
          float sum = 0;
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            s[mt][j][2 * hr] = exp2_approx(s[mt][j][2 * hr] - ref);
            s[mt][j][2 * hr + 1] = exp2_approx(s[mt][j][2 * hr + 1] - ref);
            sum += s[mt][j][2 * hr] + s[mt][j][2 * hr + 1];
          }
          row_sum[mt][hr] = row_sum[mt][hr] * correction + sum;
#pragma unroll
          for (int d = 0; d < HD / 8; ++d) {
            o[mt][d][2 * hr] *= correction;
            o[mt][d][2 * hr + 1] *= correction;
          }
        }

      // O += P V: keys 16 kk .. + 15 are the k dimension.
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          pa[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dd = 0; dd < HD / 16; ++dd) {
          // Matrices (transposed): keys +0..7 then +8..15 of dims 16 dd + 0..7, then of + 8..15.
          uint32_t b[4];
          ldmatrix_x4_trans(b, smem_address(vs + swizzled<HD>(kk * 16 + ((lane / 8) % 2) * 8 + lane % 8, dd * 2 + lane / 16)));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(o[mt][2 * dd], pa[mt], b[0], b[1]);
            mma_bf16(o[mt][2 * dd + 1], pa[mt], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float sum = row_sum[mt][hr];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0 ? 1.0f / sum : 0.0f;
      const int t = m0 + warp_row0 + mt * 16 + g + hr * 8;
      if (t >= a.T) continue;
      float* dst = a.out + (int64_t(t) * a.n_heads + h) * HD + 2 * c;
#pragma unroll
      for (int d = 0; d < HD / 8; ++d)
        *reinterpret_cast<float2*>(dst + d * 8) = make_float2(o[mt][d][2 * hr] * inv, o[mt][d][2 * hr + 1] * inv);
    }
}

// The tile shapes compiled for each head_dim, the default first; the others stay
// for FlashAttention.SpeedAgainstSplitK to time. On the H200 at T = 4096, 32 / 8
// heads (16 / 8 for 256), the defaults ran at 291, 279 and 213 TFLOP/s for
// head_dim 64, 128 and 256; the alternatives 5 to 15% slower (the 3- and 4-block
// caps spill a few registers).
template <int HD>
struct Tiles;
template <>
struct Tiles<64> {
  static constexpr FlashAttentionTile list[] = {
      {4, 2, 64, true, 1}, {4, 1, 64, true, 3}, {4, 1, 64, true, 4}, {8, 1, 64, true, 2}, {4, 2, 32, true, 2}};
};
template <>
struct Tiles<128> {
  static constexpr FlashAttentionTile list[] = {
      {4, 1, 64, true, 2}, {4, 1, 64, true, 3}, {4, 2, 32, false, 1}, {4, 1, 32, true, 3}, {8, 1, 64, true, 1}};
};
template <>
struct Tiles<256> {
  static constexpr FlashAttentionTile list[] = {{4, 1, 32, false, 2}, {8, 1, 32, false, 1}};
};
template <int HD>
constexpr int kTileCount = int(sizeof(Tiles<HD>::list) / sizeof(FlashAttentionTile));

template <int HD, int I>
cudaError_t launch_tile(const FlashArgs& a, cudaStream_t stream) {
  constexpr FlashAttentionTile t = Tiles<HD>::list[I];
  using C = Tile<HD, t.warps, t.warp_m_tiles, t.keys, t.q_in_registers>;
  auto kernel = flash_attention_kernel<HD, t.warps, t.warp_m_tiles, t.keys, t.q_in_registers, t.min_blocks>;
  // Above 48 KB a kernel must ask for its dynamic shared memory; once per kernel.
  static const cudaError_t attribute =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes));
  if (attribute != cudaSuccess) return attribute;
  launch_kernel(kernel, dim3(a.n_heads, ceil_div(a.T, C::BM)), C::kThreads, C::kSmemBytes, stream, a);
  return cudaGetLastError();
}

template <int HD>
cudaError_t launch_head_dim(int variant, const FlashArgs& a, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((variant == I ? (err = launch_tile<HD, I>(a, stream), 0) : 0), ...);
  }(std::make_integer_sequence<int, kTileCount<HD>>());
  return err;
}

}  // namespace

bool flash_attention_supports(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

int flash_attention_variants(int head_dim) {
  switch (head_dim) {
    case 64: return kTileCount<64>;
    case 128: return kTileCount<128>;
    case 256: return kTileCount<256>;
    default: return 0;
  }
}

FlashAttentionTile flash_attention_tile(int head_dim, int variant) {
  switch (head_dim) {
    case 64: return Tiles<64>::list[variant];
    case 128: return Tiles<128>::list[variant];
    default: return Tiles<256>::list[variant];
  }
}

cudaError_t launch_flash_attention(const float* q, const void* k, const void* v, float* out, int T, int n_heads,
                                   int n_kv_heads, int head_dim, const int32_t* pos_dev, int64_t pos0, float scale,
                                   cudaStream_t stream, int variant) {
  if (T <= 0) return cudaSuccess;
  if (variant < 0) variant = 0;
  if (variant >= flash_attention_variants(head_dim)) return cudaErrorInvalidValue;
  const FlashArgs a{q, static_cast<const __nv_bfloat16*>(k), static_cast<const __nv_bfloat16*>(v), out, T, n_heads,
                    n_kv_heads, pos_dev, pos0, scale * kLog2e};
  switch (head_dim) {
    case 64: return launch_head_dim<64>(variant, a, stream);
    case 128: return launch_head_dim<128>(variant, a, stream);
    case 256: return launch_head_dim<256>(variant, a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace mere::cuda
