// MLX affine-quantized weights on CUDA: the decode matvec, dequantization to a
// dense matrix (prefill: then the dense GEMM), and the embedding gather.
//
// Matvec, y[T, out] = x[T, in] w^T (+ bias) for T <= 8: a warp takes R rows
// (so each x read serves R rows) and a share of their 16-byte chunks of packed
// words (split-K: `split` warps of a block share a row group, summed through
// shared memory in a fixed order). Each lane streams one chunk of each of its
// rows per step, B steps of loads in flight, the first issued before the
// kernel waits for the previous one. A chunk holds 32 (4-bit) or 16 (8-bit)
// values of one group, so per chunk
//   sum_i w_i x_i = sum_i (scale q_i) x_i + bias sum_i x_i,
// with q_i made a float by the bit trick 2^23 + q_i (one byte permute; LOP3s
// leaving the bits in place under per-position exponents measured slower) and
// scale q_i by one exact FMA.
//
// Lanes read x at 128- or 64-byte strides, one cache line per lane, which L1
// serves slowly: when x fits, each block first copies it to shared memory
// (16-byte units XOR-swizzled within 128 bytes, so the reads are free of bank
// conflicts) with each chunk's sum of x, then loops over row blocks (a
// persistent grid of one wave). Otherwise lanes read x through L1, lane l
// starting its chunk at quad (l mod 8) of 4 values, which spreads one
// instruction's reads over the banks.
//
// Lever int8_activation_matvec (XMode::kInt8): each block quantizes x to int8
// in shared memory, symmetric per 32 values (d = max|x| / 127, as llama.cpp's
// Q8_1 activations), so a chunk's sum of q x is four (8-bit) or eight (4-bit)
// dp4a instructions instead of 16 or 32 conversions and FMAs: int4 weights are
// otherwise bound by instructions, not bytes. It costs accuracy (x rounded to
// about 2 significant digits per block), so it is a measured, explicit lever.
#include <type_traits>

#include "ops/cuda/affine_launchers.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace mere::cuda {
namespace {

constexpr int kWarps = 8;                 // per block
constexpr uint32_t kMagic = 0x4B000000u;  // the bits of 2^23: 2^23 + q once q fills the low mantissa byte
constexpr float kTwo23 = 8388608.0f;
constexpr int kMaxStagedBytes = 100 * 1024;  // x and chunk sums in shared memory: two blocks fit an SM

// Where the lanes read x from: global memory through L1, an f32 copy in shared
// memory, or an int8 copy in shared memory (lever int8_activation_matvec).
enum class XMode { kGlobal, kStaged, kInt8 };

// 2^23 + byte k of v, as a float (k is a constant once loops are unrolled).
__device__ __forceinline__ float magic_byte(uint32_t v, int k) {
  return __uint_as_float(__byte_perm(v, kMagic, 0x7440 + k));
}

// Where float4 f of a staged row of x lives: XOR-swizzled within 8 (128 bytes).
__device__ __forceinline__ int swizzle(int f) { return f ^ ((f >> 3) & 7); }

struct Problem {
  const uint4* packed;
  const void* scales;
  const void* biases;
  const float* x;
  const float* bias;
  float* y;
  int64_t in, out;
  int64_t n_chunks, n_groups;  // per row
  int group_shift;             // chunk index >> group_shift = group index
  // Lever fused_norm_matvec (staged x only): x is h, each block stages h norm_w
  // and scales its sums by 1 / rms(h), so y = RMSNorm(h) norm_w w^T.
  const void* norm_w;
  DType norm_dtype;
  float eps;
  // The next kernel may start only after this one's wait, so that it can read
  // what the kernel before this one wrote before its own wait.
  bool allow_after_wait;
  // The matvec reads its weights with an L2 evict-first hint (lever streamed_weights).
  bool streamed_weights;
};

// Norm weights of in <= kNormRuns * 4 * blockDim.x columns are read before the wait.
constexpr int kNormRuns = 4;

// Norm weights 4 f to 4 f + 3.
__device__ __forceinline__ float4 norm_weights(const Problem& p, int f) {
  if (p.norm_dtype == DType::f32) return __ldg(static_cast<const float4*>(p.norm_w) + f);
  const uint2 v = __ldg(static_cast<const uint2*>(p.norm_w) + f);
  if (p.norm_dtype == DType::bf16) {
    const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(&v.x), b = *reinterpret_cast<const __nv_bfloat162*>(&v.y);
    return make_float4(__low2float(a), __high2float(a), __low2float(b), __high2float(b));
  }
  const __half2 a = *reinterpret_cast<const __half2*>(&v.x), b = *reinterpret_cast<const __half2*>(&v.y);
  return make_float4(__low2float(a), __high2float(a), __low2float(b), __high2float(b));
}

// Stages h [T, in] times the norm weights `held` (read before the wait), as
// the staged copy holds x, and returns each token's 1 / rms(h): the sums of
// squares in a fixed order (thread, then warp), whatever the grid.
template <int T>
__device__ __forceinline__ void stage_normed(const Problem& p, const float4 (&held)[kNormRuns], float4* staged,
                                             float (&inverse_rms)[T]) {
  __shared__ float partial[kWarps][T];
  const int q4 = int(p.in / 4);
  const float4* h = reinterpret_cast<const float4*>(p.x);
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float4 v[kNormRuns];
#pragma unroll
    for (int j = 0; j < kNormRuns; ++j) {
      const int f = int(threadIdx.x) + j * int(blockDim.x);
      v[j] = f < q4 ? __ldg(h + t * q4 + f) : make_float4(0, 0, 0, 0);
    }
    float sum = 0;
#pragma unroll
    for (int j = 0; j < kNormRuns; ++j) {
      const int f = int(threadIdx.x) + j * int(blockDim.x);
      if (f >= q4) break;
      sum += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
      staged[t * q4 + swizzle(f)] =
          make_float4(v[j].x * held[j].x, v[j].y * held[j].y, v[j].z * held[j].z, v[j].w * held[j].w);
    }
    sum = warp_sum(sum);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32][t] = sum;
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float sum = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][t];
    inverse_rms[t] = rsqrtf(sum / float(p.in) + p.eps);
  }
}

// The chunk rotated left by k quads (half-words for 4 bits, words for 8):
// quad m then holds the chunk's quad (m + k) mod quads.
template <int kBits>
__device__ __forceinline__ void rotate_quads(uint32_t (&w)[4], int k) {
  if constexpr (kBits == 4) {
    const uint32_t half = (k & 1) ? 0x5432 : 0x3210;
    uint32_t a[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = __byte_perm(w[i], w[(i + 1) & 3], half);
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = a[i];
    k >>= 1;
  }
  const uint32_t word = (k & 1) ? 0x7654 : 0x3210;
  uint32_t b[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) b[i] = __byte_perm(w[i], w[(i + 1) & 3], word);
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = (k & 2) ? b[(i + 2) & 3] : b[i];
}

// acc[r][t] += the chunk cc of row r times token t's x. x comes from the
// staged copy (and its chunk sums) when kStaged, else from global memory,
// rotated by k quads.
template <int kBits, typename S, int T, int R, bool kStaged>
__device__ __forceinline__ void accumulate_chunk_f32(float (&acc)[R][T], const uint4 (&wq)[R], const S (&ws)[R],
                                                     const S (&wb)[R], const Problem& p, int64_t cc, int k,
                                                     const float4* staged, int q4) {
  constexpr int kQuads = 32 / kBits;
  uint32_t w[R][4];
  float s[R], c0[R], s16[R], c16[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    w[r][0] = wq[r].x;
    w[r][1] = wq[r].y;
    w[r][2] = wq[r].z;
    w[r][3] = wq[r].w;
    if constexpr (!kStaged) rotate_quads<kBits>(w[r], k);
    s[r] = to_float(ws[r]);
    c0[r] = -kTwo23 * s[r];   // scale * (2^23 + q) + c0 = scale * q, exactly rounded
    s16[r] = 0.0625f * s[r];  // high nibbles come as 16 q
    c16[r] = 0.0625f * c0[r];
  }
  float xs[T];  // sum of the chunk's x, per token
  const int f0 = int(cc) * kQuads, sw = (f0 >> 3) & 7;  // staged: the chunk's first float4 and its swizzle
  const float4* xc = reinterpret_cast<const float4*>(p.x) + f0;
  if constexpr (kStaged) {
    const float* sums = reinterpret_cast<const float*>(staged + T * q4);
#pragma unroll
    for (int t = 0; t < T; ++t) xs[t] = sums[t * p.n_chunks + cc];
  } else {
#pragma unroll
    for (int t = 0; t < T; ++t) xs[t] = 0;
  }
#pragma unroll
  for (int m = 0; m < kQuads; ++m) {
    float wv[R][4];  // scale * q of the quad's 4 values
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if constexpr (kBits == 4) {
        const uint32_t word = w[r][m / 2], lo = word & 0x0F0F0F0Fu, hi = word & 0xF0F0F0F0u;
        const int b = 2 * (m % 2);
        wv[r][0] = fmaf(s[r], magic_byte(lo, b), c0[r]);
        wv[r][1] = fmaf(s16[r], magic_byte(hi, b), c16[r]);
        wv[r][2] = fmaf(s[r], magic_byte(lo, b + 1), c0[r]);
        wv[r][3] = fmaf(s16[r], magic_byte(hi, b + 1), c16[r]);
      } else {
        const uint32_t word = w[r][m];
#pragma unroll
        for (int i = 0; i < 4; ++i) wv[r][i] = fmaf(s[r], magic_byte(word, i), c0[r]);
      }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float4 xq;
      if constexpr (kStaged) {
        xq = staged[t * q4 + ((f0 + m) ^ sw)];
      } else {
        xq = __ldg(xc + t * q4 + ((m + k) & (kQuads - 1)));
        xs[t] += (xq.x + xq.y) + (xq.z + xq.w);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        acc[r][t] = fmaf(wv[r][0], xq.x, acc[r][t]);
        acc[r][t] = fmaf(wv[r][1], xq.y, acc[r][t]);
        acc[r][t] = fmaf(wv[r][2], xq.z, acc[r][t]);
        acc[r][t] = fmaf(wv[r][3], xq.w, acc[r][t]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float b = to_float(wb[r]);
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = fmaf(b, xs[t], acc[r][t]);
  }
}

// dp4a: the sum of the four products of unsigned bytes of a and signed bytes of b, plus c.
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Int8 staging: the int8 copy of x (XMode::kInt8), per token: the codes (in
// bytes), then per chunk a float2 {d, d * sum of the chunk's codes}. A chunk's
// codes are in the order its packed weights unpack: 8-bit, as stored; 4-bit,
// per word the low nibbles (elements 0, 2, 4, 6 of its 8) then the high ones
// (1, 3, 5, 7), the chunk's first two words' codes in one plane and the last
// two in a second (each lane reads 16 consecutive bytes twice: no bank conflicts).
__host__ __device__ inline int64_t int8_token_bytes(int64_t in, int64_t n_chunks) {
  return (in + 8 * n_chunks + 15) / 16 * 16;
}

// Byte offset of element i's code within a token's codes.
template <int kBits>
__device__ __forceinline__ int int8_code_offset(int i, int in) {
  if constexpr (kBits == 8) {
    return i;
  } else {
    const int chunk = i / 32, v = i % 32, word = v / 8, n = v % 8;
    return (word / 2) * (in / 2) + chunk * 16 + ((word % 2) * 2 + (n % 2)) * 4 + n / 2;
  }
}

// Quantizes x [T, in] into the shared copy. A lane takes 4 consecutive values
// (8 lanes a block of 32) and issues up to kLoads loads before using any: the
// staging is bound by their latency, not by the arithmetic.
template <int kBits, int T>
__device__ __forceinline__ void stage_int8(const Problem& p, uint8_t* staged, int64_t token_bytes) {
  constexpr int kLoads = 8;
  constexpr int kChunkLanes = kBits == 8 ? 4 : 8;  // lanes per chunk of packed weights (16 or 32 values)
  const int in = int(p.in), n4 = in / 4;           // in % 32 == 0: a block of 8 lanes is all in or all out
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float4* x4 = reinterpret_cast<const float4*>(p.x) + t * n4;
    uint8_t* token = staged + t * token_bytes;
    for (int f0 = threadIdx.x; f0 - int(threadIdx.x % 32) < n4; f0 += kLoads * blockDim.x) {
      float4 v[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int f = f0 + u * blockDim.x;
        v[u] = f < n4 ? __ldg(x4 + f) : make_float4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int f = f0 + u * blockDim.x;
        if (f - int(threadIdx.x % 32) >= n4) break;  // the whole warp is past the end
        float amax = fmaxf(fmaxf(fabsf(v[u].x), fabsf(v[u].y)), fmaxf(fabsf(v[u].z), fabsf(v[u].w)));
#pragma unroll
        for (int o = 1; o < 8; o *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float d = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        const int q0 = __float2int_rn(v[u].x * inv), q1 = __float2int_rn(v[u].y * inv),
                  q2 = __float2int_rn(v[u].z * inv), q3 = __float2int_rn(v[u].w * inv);
        int sum = (q0 + q1) + (q2 + q3);
#pragma unroll
        for (int o = 1; o < kChunkLanes; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (f >= n4) continue;
        const int e = 4 * f;  // the first of the four elements
        auto byte = [](int q, int k) { return (uint32_t(q) & 0xffu) << (8 * k); };
        if constexpr (kBits == 8) {
          *reinterpret_cast<uint32_t*>(token + e) = byte(q0, 0) | byte(q1, 1) | byte(q2, 2) | byte(q3, 3);
        } else {
          // Elements n0..n0+3 of a word (n0 = 0 or 4): the even ones are low nibbles, the odd ones high.
          const int base = int8_code_offset<4>(e, in);
          *reinterpret_cast<uint16_t*>(token + base) = uint16_t(byte(q0, 0) | byte(q2, 1));
          *reinterpret_cast<uint16_t*>(token + base + 4) = uint16_t(byte(q1, 0) | byte(q3, 1));
        }
        if (f % kChunkLanes == 0) reinterpret_cast<float2*>(token + in)[e * kBits / 128] = make_float2(d, d * float(sum));
      }
    }
  }
}

// acc[r][t] += chunk cc of row r times token t's int8 x:
//   scale * d * sum(q xq) + bias * d * sum(xq).
template <int kBits, typename S, int T, int R>
__device__ __forceinline__ void accumulate_chunk_int8(float (&acc)[R][T], const uint4 (&wq)[R], const S (&ws)[R],
                                                      const S (&wb)[R], const Problem& p, int64_t cc,
                                                      const uint8_t* staged, int64_t token_bytes) {
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const uint8_t* token = staged + t * token_bytes;
    const float2 ds = reinterpret_cast<const float2*>(token + p.in)[cc];
    const uint4 c0 = reinterpret_cast<const uint4*>(token)[cc];
    uint4 c1 = c0;
    if constexpr (kBits == 4) c1 = reinterpret_cast<const uint4*>(token + p.in / 2)[cc];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      int sum;
      if constexpr (kBits == 8) {
        sum = dp4a_us(wq[r].x, c0.x, 0);
        sum = dp4a_us(wq[r].y, c0.y, sum);
        sum = dp4a_us(wq[r].z, c0.z, sum);
        sum = dp4a_us(wq[r].w, c0.w, sum);
      } else {
        const uint32_t w[4] = {wq[r].x, wq[r].y, wq[r].z, wq[r].w};
        const uint32_t c[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
        sum = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          sum = dp4a_us(w[j] & 0x0F0F0F0Fu, c[2 * j], sum);
          sum = dp4a_us((w[j] >> 4) & 0x0F0F0F0Fu, c[2 * j + 1], sum);
        }
      }
      acc[r][t] = fmaf(to_float(ws[r]) * ds.x, float(sum), fmaf(to_float(wb[r]), ds.y, acc[r][t]));
    }
  }
}

// Block b of the grid takes blocks of rows b, b + gridDim.x, ... of the
// n_blocks there are (one, unless staged).
template <int kBits, typename S, int T, int R, int B, XMode kX>
__global__ void __launch_bounds__(kWarps * 32)
    affine_matvec_kernel(const __grid_constant__ Problem p, int split, int64_t n_blocks) {
  static_assert(R * T <= 32, "one lane writes each result");
  constexpr int kQuads = 32 / kBits;
  constexpr bool kStaged = kX == XMode::kStaged;
  // kStaged: x [T][in / 4] swizzled, then chunk sums [T][n_chunks]; kInt8: see Int8 staging.
  extern __shared__ float4 staged[];
  __shared__ float partial[2][kWarps][R * T];
  const S* scales = static_cast<const S*>(p.scales);
  const S* biases = static_cast<const S*>(p.biases);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, part = warp % split;
  const int q4 = int(p.in / 4);
  const int64_t rows_per_block = int64_t(kWarps / split) * R;
  // This warp's chunks [begin, end) of each row: shares in whole rounds of 32 lanes.
  const int64_t share = (p.n_chunks + 32 * split - 1) / (32 * split) * 32;
  const int64_t begin = part * share, first = begin + lane;
  const int k = kX != XMode::kGlobal ? 0 : kBits == 4 ? lane & 7 : (lane >> 1) & 3;
  const int64_t int8_bytes = int8_token_bytes(p.in, p.n_chunks);

  int64_t row0 = 0, end = 0, row[R];  // rows past the end read the last row again and are not written
  auto set_rows = [&](int64_t b) {
    row0 = b * rows_per_block + int64_t(warp / split) * R;
    end = row0 < p.out ? min(p.n_chunks, begin + share) : begin;
#pragma unroll
    for (int r = 0; r < R; ++r) row[r] = min(row0 + r, p.out - 1);
  };
  uint4 wq[B][R];
  S ws[B][R], wb[B][R];
  const uint64_t evict_first = l2_evict_first();
  auto load = [&](int64_t c) {
#pragma unroll
    for (int u = 0; u < B; ++u) {
      const int64_t cc = c + 32 * u;
      if (cc < end) {
        const int64_t g = cc >> p.group_shift;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          wq[u][r] = load_streaming(p.packed + row[r] * p.n_chunks + cc, p.streamed_weights, evict_first);
          ws[u][r] = __ldg(scales + row[r] * p.n_groups + g);
          wb[u][r] = __ldg(biases + row[r] * p.n_groups + g);
        }
      }
    }
  };
  // Weights never change during a forward: the first batch loads before the wait.
  int64_t b = blockIdx.x;
  set_rows(b);
  load(first);
  // So do the norm weights of the fused RMSNorm.
  float4 held_norm[kNormRuns];
  if (kStaged && p.norm_w)
#pragma unroll
    for (int j = 0; j < kNormRuns; ++j) {
      const int f = int(threadIdx.x) + j * int(blockDim.x);
      held_norm[j] = f < q4 ? norm_weights(p, f) : make_float4(0, 0, 0, 0);
    }
  if (!p.allow_after_wait) allow_next_kernel();
  wait_for_previous_kernel();
  if (p.allow_after_wait) allow_next_kernel();

  float inverse_rms[T];
#pragma unroll
  for (int t = 0; t < T; ++t) inverse_rms[t] = 1.0f;
  if constexpr (kStaged) {
    if (p.norm_w) {
      stage_normed<T>(p, held_norm, staged, inverse_rms);
    } else {
      const float4* x4 = reinterpret_cast<const float4*>(p.x);
      for (int i = threadIdx.x; i < T * q4; i += blockDim.x) {
        const int t = i / q4, f = i - t * q4;
        staged[t * q4 + swizzle(f)] = __ldg(x4 + i);
      }
    }
    __syncthreads();
    float* sums = reinterpret_cast<float*>(staged + T * q4);
    for (int i = threadIdx.x; i < T * int(p.n_chunks); i += blockDim.x) {
      const int t = i / int(p.n_chunks), f0 = (i - t * int(p.n_chunks)) * kQuads;
      float sum = 0;
#pragma unroll
      for (int m = 0; m < kQuads; ++m) {
        const float4 v = staged[t * q4 + swizzle(f0 + m)];
        sum += (v.x + v.y) + (v.z + v.w);
      }
      sums[i] = sum;
    }
    __syncthreads();
  } else if constexpr (kX == XMode::kInt8) {
    stage_int8<kBits, T>(p, reinterpret_cast<uint8_t*>(staged), int8_bytes);
    __syncthreads();
  }

  for (int iteration = 0; b < n_blocks; b += gridDim.x, ++iteration) {
    if (iteration > 0) {
      set_rows(b);
      load(first);
    }
    float acc[R][T];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) acc[r][t] = 0;
    for (int64_t c = first; c < end; c += 32 * B) {
      if (c != first) load(c);
#pragma unroll
      for (int u = 0; u < B; ++u)
        if (c + 32 * u < end)
          if constexpr (kX == XMode::kInt8)
            accumulate_chunk_int8<kBits, S, T, R>(acc, wq[u], ws[u], wb[u], p, c + 32 * u,
                                                  reinterpret_cast<const uint8_t*>(staged), int8_bytes);
          else
            accumulate_chunk_f32<kBits, S, T, R, kStaged>(acc, wq[u], ws[u], wb[u], p, c + 32 * u, k, staged, q4);
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) acc[r][t] = warp_sum(acc[r][t]);
    if (split > 1) {
      // The row group's first warp adds the others' sums, in a fixed order. The
      // two buffers alternate, so one barrier per row block suffices.
      float (*buffer)[R * T] = partial[iteration & 1];
      if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int t = 0; t < T; ++t) buffer[warp][r * T + t] = acc[r][t];
      __syncthreads();
      if (part == 0)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int t = 0; t < T; ++t)
            for (int q = 1; q < split; ++q) acc[r][t] += buffer[warp + q][r * T + t];
    }
    if (part != 0) continue;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const int64_t o = row0 + r;
        const float v = acc[r][t] * inverse_rms[t];
        if (lane == r * T + t && o < p.out) p.y[t * p.out + o] = p.bias ? v + p.bias[o] : v;
      }
  }
}

// The values of chunk c of row o, scale * q + bias in f32.
template <int kBits, typename S>
__device__ __forceinline__ void dequantize_chunk(const Problem& p, int64_t o, int64_t c, float (&v)[128 / kBits]) {
  constexpr int kPerWord = 32 / kBits;
  constexpr uint32_t kMask = (1u << kBits) - 1;
  const uint4 chunk = load_streaming(p.packed + o * p.n_chunks + c, false, 0);
  const int64_t g = o * p.n_groups + (c >> p.group_shift);
  const float s = to_float(static_cast<const S*>(p.scales)[g]), b = to_float(static_cast<const S*>(p.biases)[g]);
  const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
  // q as a float by the 2^23 bit trick: an integer-to-float conversion runs at a quarter rate.
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int n = 0; n < kPerWord; ++n) {
      const float q = __uint_as_float(((words[j] >> (n * kBits)) & kMask) | kMagic) - kTwo23;
      v[j * kPerWord + n] = s * q + b;
    }
}

// One thread per 16 weights (n of them, fewer than 2^32): a chunk of int8 or
// half a chunk of int4, so that int4 threads keep as few stores in flight as
// int8 ones (a whole int4 chunk a thread ran at half the bandwidth).
template <int kBits, typename S, typename D>
__global__ void affine_dequantize_kernel(const __grid_constant__ Problem p, D* dst, uint32_t n) {
  constexpr int kWords = kBits / 2;  // 32-bit words holding 16 weights
  constexpr int kPerWord = 32 / kBits;
  constexpr int kChunkShift = kBits == 8 ? 4 : 5;  // log2(weights per chunk)
  constexpr uint32_t kMask = (1u << kBits) - 1;
  allow_next_kernel();
  wait_for_previous_kernel();
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint32_t per_row = uint32_t(p.in / 16);
  const uint32_t o = i / per_row, first = (i - o * per_row) * 16;  // row, and its first weight
  uint32_t words[kWords];
  const uint32_t* src = reinterpret_cast<const uint32_t*>(p.packed) + int64_t(i) * kWords;  // rows are contiguous
  if constexpr (kWords == 4) {
    const uint4 w = load_streaming(src, false, 0);
    words[0] = w.x, words[1] = w.y, words[2] = w.z, words[3] = w.w;
  } else {
    const uint2 w = __ldcs(reinterpret_cast<const uint2*>(src));
    words[0] = w.x, words[1] = w.y;
  }
  const int64_t g = int64_t(o) * p.n_groups + (first >> (p.group_shift + kChunkShift));
  const float s = to_float(static_cast<const S*>(p.scales)[g]), b = to_float(static_cast<const S*>(p.biases)[g]);
  alignas(16) D d[16];
  // q as a float by the 2^23 bit trick: an integer-to-float conversion runs at a quarter rate.
#pragma unroll
  for (int j = 0; j < kWords; ++j)
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) {
      const float q = __uint_as_float(((words[j] >> (k * kBits)) & kMask) | kMagic) - kTwo23;
      d[j * kPerWord + k] = from_float<D>(s * q + b);
    }
  uint4* out = reinterpret_cast<uint4*>(dst + int64_t(i) * 16);
#pragma unroll
  for (int j = 0; j < int(16 * sizeof(D) / 16); ++j) out[j] = reinterpret_cast<const uint4*>(d)[j];
}

// Block (x, t): chunks of row ids[t], threads over the row.
template <int kBits, typename S>
__global__ void affine_embed_kernel(const __grid_constant__ Problem p, const int32_t* ids, float* out) {
  constexpr int kPerChunk = 128 / kBits;
  allow_next_kernel();
  wait_for_previous_kernel();
  const int64_t t = blockIdx.y;
  const int32_t id = ids[t];
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < p.n_chunks; c += int64_t(gridDim.x) * blockDim.x) {
    float v[kPerChunk];
    if (id >= 0 && id < p.out) {
      dequantize_chunk<kBits, S>(p, id, c, v);
    } else {
#pragma unroll
      for (int j = 0; j < kPerChunk; ++j) v[j] = __int_as_float(0x7fc00000);
    }
    float4* dst = reinterpret_cast<float4*>(out + t * p.in + c * kPerChunk);
#pragma unroll
    for (int j = 0; j < kPerChunk / 4; ++j) dst[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
  }
}

__device__ __forceinline__ uint64_t mix64(uint64_t seed, uint64_t index) {  // SplitMix64's finalizer
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_random_bytes_kernel(uint8_t* dst, int64_t n, uint64_t seed, uint64_t mask) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k * 8 < n; k += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t z = mix64(seed, uint64_t(k)) & mask;
    if (k * 8 + 8 <= n)
      reinterpret_cast<uint64_t*>(dst)[k] = z;
    else
      for (int64_t i = k * 8; i < n; ++i) dst[i] = uint8_t(z >> (8 * (i - k * 8)));
  }
}

// ---- host side ----

int log2_exact(int64_t v) {  // -1 unless v is a power of two
  if (v <= 0 || (v & (v - 1))) return -1;
  int s = 0;
  while ((int64_t(1) << s) < v) ++s;
  return s;
}

bool supported(const AffineArgs& w) {
  if ((w.bits != 4 && w.bits != 8) || w.in <= 0 || w.out <= 0 || w.in % w.group_size != 0) return false;
  if (w.group_size != 32 && w.group_size != 64 && w.group_size != 128) return false;
  return reinterpret_cast<uintptr_t>(w.packed) % 16 == 0 && w.in % 32 == 0;
}

Problem problem(const AffineArgs& w, const float* x, const float* bias, float* y) {
  Problem p{};
  p.packed = reinterpret_cast<const uint4*>(w.packed);
  p.scales = w.scales;
  p.biases = w.biases;
  p.x = x;
  p.bias = bias;
  p.y = y;
  p.in = w.in;
  p.out = w.out;
  p.n_chunks = w.in * w.bits / 128;
  p.n_groups = w.in / w.group_size;
  p.group_shift = log2_exact(w.group_size / (128 / w.bits));
  p.streamed_weights = streamed_weights_enabled();
  return p;
}

// Calls fn.template operator()<kBits, S>() for the weight's bits and scale type.
template <typename Fn>
cudaError_t visit_affine(const AffineArgs& w, Fn&& fn) {
  if (!supported(w)) return cudaErrorInvalidValue;
  return visit_float(w.scale_dtype, [&]<typename S>() {
    if (w.bits == 4)
      fn.template operator()<4, S>();
    else
      fn.template operator()<8, S>();
  });
}

// Shared memory for x in mode kX: an f32 copy and its chunk sums, or the int8 copy.
int64_t staged_bytes(XMode kX, int64_t in, int64_t n_chunks, int64_t T) {
  if (kX == XMode::kStaged) return T * (in + n_chunks) * 4;
  if (kX == XMode::kInt8) return T * int8_token_bytes(in, n_chunks);
  return 0;
}
int64_t staged_bytes(XMode kX, const AffineArgs& w, int64_t T) {
  return staged_bytes(kX, w.in, w.in * w.bits / 128, T);
}

// One compiled shape of the matvec.
template <int kBits, typename S, int T, int R, int B, XMode kX>
struct Variant {
  static constexpr auto kernel = affine_matvec_kernel<kBits, S, T, R, B, kX>;

  // Blocks resident on one SM with `smem` bytes of x staged.
  static int blocks_per_sm(int64_t smem) {
    if constexpr (kX != XMode::kGlobal) {
      static const cudaError_t raised =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxStagedBytes);
      (void)raised;
    }
    int blocks = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kWarps * 32, size_t(smem));
    return blocks > 0 ? blocks : 1;
  }

  static AffineMatvecPlan plan(const Problem& p, int split_hint) {
    const int64_t smem = staged_bytes(kX, p.in, p.n_chunks, T);
    const int64_t resident_warps = int64_t(blocks_per_sm(smem)) * kWarps * sm_count();
    int split = split_hint;
    if (split <= 0) {
      // Split-K until the row groups fill one wave of resident warps, keeping
      // at least one whole batch of loads per lane.
      const int64_t row_groups = (p.out + R - 1) / R;
      split = 1;
      if (matvec_split_k_enabled())
        while (split < kWarps && row_groups * split * 2 <= resident_warps && p.n_chunks / (split * 2) >= 32 * B)
          split *= 2;
    }
    return {R, B, split, int(kX)};
  }

  static cudaError_t launch(const Problem& p, int split_hint, cudaStream_t stream) {
    const int64_t smem = staged_bytes(kX, p.in, p.n_chunks, T);
    const int split = std::min(plan(p, split_hint).split, kWarps);
    const int64_t rows_per_block = int64_t(R) * (kWarps / split);
    const int64_t n_blocks = (p.out + rows_per_block - 1) / rows_per_block;
    // Staged: a persistent grid of one wave, each block copying x once.
    const int64_t grid = kX != XMode::kGlobal
                             ? std::min<int64_t>(n_blocks, int64_t(blocks_per_sm(smem)) * sm_count())
                             : n_blocks;
    return launch_kernel(kernel, dim3(unsigned(grid)), dim3(kWarps * 32), size_t(smem), stream, p, split, n_blocks);
  }
};

// The mode a launch uses: the hint's, else int8 under the lever where it fits,
// else the f32 copy where it fits, else global memory.
XMode x_mode(const AffineArgs& w, int64_t T, const AffineMatvecPlan& hint) {
  auto fits = [&](XMode m) { return staged_bytes(m, w, T) <= kMaxStagedBytes; };
  if (hint.stage >= 0) {
    const XMode m = XMode(std::min(hint.stage, 2));
    return fits(m) ? m : XMode::kGlobal;
  }
  if (int8_activation_matvec_enabled() && fits(XMode::kInt8)) return XMode::kInt8;
  return fits(XMode::kStaged) ? XMode::kStaged : XMode::kGlobal;
}

// One token of a matrix of at most one row an SM (a MoE router's) takes two rows
// a warp instead of four, so twice the SMs share its few blocks (the same sums
// in the same order): Qwen3-30B-A3B's 128-row router, int4 decode +3.4%
// (docs/benchmarks.md). An explicit hint stands.
AffineMatvecPlan one_token_hint(const AffineArgs& w, AffineMatvecPlan hint) {
  if (hint.rows == 0 && hint.batch == 0 && w.out <= sm_count()) hint.rows = 2, hint.batch = 2;
  return hint;
}

// Calls fn with the Variant for T, mode kX and the plan's hints; (T = 1, bf16
// scales) the alternative rows and batches the timing test compares.
template <int kBits, typename S, int T, XMode kX, typename Fn>
void visit_rows(const AffineMatvecPlan& hint, Fn&& fn) {
  constexpr int kB = T <= 2 ? 2 : 1;
  if constexpr (T == 1 && std::is_same_v<S, __nv_bfloat16> && kX != XMode::kGlobal) {
    if (hint.rows == 4 && hint.batch == 1) return fn(Variant<kBits, S, T, 4, 1, kX>{});
    if (hint.rows == 2 && hint.batch == 2) return fn(Variant<kBits, S, T, 2, 2, kX>{});
    if (hint.rows == 2 && hint.batch == 4) return fn(Variant<kBits, S, T, 2, 4, kX>{});
    if (hint.rows == 8 && hint.batch == 1) return fn(Variant<kBits, S, T, 8, 1, kX>{});
  }
  fn(Variant<kBits, S, T, 4, kB, kX>{});
}

template <int kBits, typename S, int T, typename Fn>
void visit_variant(const AffineArgs& w, const AffineMatvecPlan& hint, Fn&& fn) {
  switch (x_mode(w, T, hint)) {
    case XMode::kInt8: return visit_rows<kBits, S, T, XMode::kInt8>(hint, fn);
    case XMode::kStaged: return visit_rows<kBits, S, T, XMode::kStaged>(hint, fn);
    default: return visit_rows<kBits, S, T, XMode::kGlobal>(hint, fn);
  }
}

template <int kBits, typename S, typename Fn>
void visit_tokens(const AffineArgs& w, int64_t T, const AffineMatvecPlan& hint, Fn&& fn) {
  switch (T) {
    case 1: return visit_variant<kBits, S, 1>(w, one_token_hint(w, hint), fn);
    case 2: return visit_variant<kBits, S, 2>(w, hint, fn);
    case 3: return visit_variant<kBits, S, 3>(w, hint, fn);
    case 4: return visit_variant<kBits, S, 4>(w, hint, fn);
    case 5: return visit_variant<kBits, S, 5>(w, hint, fn);
    case 6: return visit_variant<kBits, S, 6>(w, hint, fn);
    case 7: return visit_variant<kBits, S, 7>(w, hint, fn);
    default: return visit_variant<kBits, S, 8>(w, hint, fn);
  }
}

}  // namespace

bool affine_matvec_supports(const AffineArgs& w, int64_t T) {
  return T >= 1 && T <= kMaxMatvecTokens && supported(w);
}

AffineMatvecPlan affine_matvec_plan(const AffineArgs& w, int64_t T, AffineMatvecPlan hint) {
  AffineMatvecPlan plan{};
  if (!affine_matvec_supports(w, T)) return plan;
  const Problem p = problem(w, nullptr, nullptr, nullptr);
  visit_affine(w, [&]<int kBits, typename S>() {
    visit_tokens<kBits, S>(w, T, hint, [&](auto variant) { plan = decltype(variant)::plan(p, hint.split); });
  });
  return plan;
}

cudaError_t launch_affine_matvec(const AffineArgs& w, const float* x, const float* bias, float* y, int64_t T,
                                 cudaStream_t stream, AffineMatvecPlan hint) {
  if (!affine_matvec_supports(w, T) || reinterpret_cast<uintptr_t>(x) % 16) return cudaErrorInvalidValue;
  if (hint.split != 0 && log2_exact(hint.split) < 0) return cudaErrorInvalidValue;
  const Problem p = problem(w, x, bias, y);
  cudaError_t status = cudaSuccess;
  cudaError_t dispatch = visit_affine(w, [&]<int kBits, typename S>() {
    visit_tokens<kBits, S>(w, T, hint,
                           [&](auto variant) { status = decltype(variant)::launch(p, hint.split, stream); });
  });
  return status != cudaSuccess ? status : dispatch;
}

bool affine_matvec_normed_supports(const AffineArgs& w, int64_t T, DType norm_dtype) {
  const bool float_norm = norm_dtype == DType::f32 || norm_dtype == DType::f16 || norm_dtype == DType::bf16;
  return float_norm && affine_matvec_supports(w, T) && w.in <= kNormRuns * 4 * kWarps * 32 &&
         staged_bytes(XMode::kStaged, w, T) <= kMaxStagedBytes;
}

cudaError_t launch_affine_matvec_normed(const AffineArgs& w, const float* h, const AffineMatvecNorm& norm,
                                        const float* bias, float* y, int64_t T, cudaStream_t stream) {
  if (!affine_matvec_normed_supports(w, T, norm.dtype) || reinterpret_cast<uintptr_t>(h) % 16 || !norm.w ||
      reinterpret_cast<uintptr_t>(norm.w) % 16)
    return cudaErrorInvalidValue;
  Problem p = problem(w, h, bias, y);
  p.norm_w = norm.w;
  p.norm_dtype = norm.dtype;
  p.eps = norm.eps;
  p.allow_after_wait = norm.allow_after_wait;
  const AffineMatvecPlan hint{.stage = int(XMode::kStaged)};
  cudaError_t status = cudaSuccess;
  cudaError_t dispatch = visit_affine(w, [&]<int kBits, typename S>() {
    visit_tokens<kBits, S>(w, T, hint, [&](auto variant) { status = decltype(variant)::launch(p, 0, stream); });
  });
  return status != cudaSuccess ? status : dispatch;
}

cudaError_t launch_affine_dequantize(const AffineArgs& w, void* dst, DType dst_dtype, cudaStream_t stream) {
  const Problem p = problem(w, nullptr, nullptr, nullptr);
  const int64_t n = p.out * (p.in / 16);  // one thread per 16 weights
  if (n >= (int64_t(1) << 32)) return cudaErrorInvalidValue;
  cudaError_t status = cudaSuccess;
  cudaError_t dispatch = visit_affine(w, [&]<int kBits, typename S>() {
    status = visit_float(dst_dtype, [&]<typename D>() {
      launch_kernel(affine_dequantize_kernel<kBits, S, D>, dim3(ceil_div(n, 256)), dim3(256), 0, stream, p,
                    static_cast<D*>(dst), uint32_t(n));
    });
  });
  return status != cudaSuccess ? status : dispatch;
}

cudaError_t launch_affine_embed(const AffineArgs& w, const int32_t* ids, int64_t T, float* out, cudaStream_t stream) {
  if (T <= 0) return cudaSuccess;
  const Problem p = problem(w, nullptr, nullptr, nullptr);
  const dim3 grid(ceil_div(p.n_chunks, 128), unsigned(T));
  return visit_affine(w, [&]<int kBits, typename S>() {
    launch_kernel(affine_embed_kernel<kBits, S>, grid, dim3(128), 0, stream, p, ids, out);
  });
}

cudaError_t launch_fill_random_bytes(void* dst, int64_t n_bytes, uint64_t seed, uint8_t byte_mask,
                                     cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(dst) % 8) return cudaErrorInvalidValue;
  if (n_bytes <= 0) return cudaSuccess;
  const uint64_t mask = uint64_t(byte_mask) * 0x0101010101010101ull;
  launch_kernel(fill_random_bytes_kernel, dim3(grid_for((n_bytes + 7) / 8)), dim3(256), 0, stream,
                static_cast<uint8_t*>(dst), n_bytes, seed, mask);
  return cudaGetLastError();
}

}  // namespace mere::cuda
