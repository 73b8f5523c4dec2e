// What the tensor-core decode matvecs (affine_matvec_mma.cu, fp8_matvec_mma.cu)
// share: tiles of 16 rows in blocks of 8 warps, `split` warps of a block per
// tile (split-K) adding their sums in a fixed order (the choice of split:
// matvec_split.h); the ring's first stages and x's staged image. (Each kernel
// reads what its sums are added to itself: a shared form of that changed the
// int4 eight-token kernel's code and cost it 3%, H200, 2026-11-30.)
#pragma once

#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/matvec_split.h"

namespace mere::cuda::tiles {

// The most dynamic shared memory a block may take on this device (opt-in).
inline int max_smem() {
  static const int bytes = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  return bytes;
}

// At a tile's last stage: the split warps' sums (rows g and g + 8 of each mma's
// columns) meet in the first warp of the tile, in warp order, through `partial`
// ([kWarps][kMmas][32] float2). Every thread of the block calls it.
template <int kMmas>
__device__ __forceinline__ void add_split_sums(float (&acc)[kMmas][2], float2* partial, int split, int warp, int part,
                                               int lane) {
  if (split <= 1) return;
#pragma unroll
  for (int m = 0; m < kMmas; ++m) partial[(warp * kMmas + m) * 32 + lane] = make_float2(acc[m][0], acc[m][1]);
  __syncthreads();
  if (part == 0)
    for (int w = warp + 1; w < warp + split; ++w)
#pragma unroll
      for (int m = 0; m < kMmas; ++m) {
        const float2 o = partial[(w * kMmas + m) * 32 + lane];
        acc[m][0] += o.x, acc[m][1] += o.y;
      }
  __syncthreads();  // partial is rewritten at the next tile
}

// The MoE experts' modes of both matvecs (moe_launchers.h): gate/up, a block
// row (blockIdx.y) per (token, slot) pair over its expert's gate then up rows;
// down, a block row per token over its k experts' rows side by side, warp
// part s of a tile on slot s (split = k).
constexpr int kDense = 0, kMoeGateUp = 1, kMoeDown = 2;  // what a matvec launch computes

struct MoeBlock {
  int token = 0;            // whose image the block stages
  int slot = 0;             // down: the warp's slot; its row pointers start `slot` rows early, as its
                            // stages are [slot, slot + 1) rows of the slots' concatenated row
  int64_t expert_row0 = 0;  // the storage row of the expert's row 0
};
template <int kMode>
__device__ __forceinline__ MoeBlock moe_block(const int32_t* ids, int k, int64_t expert_stride, int part) {
  MoeBlock b;
  if constexpr (kMode == kMoeGateUp) {
    const int pair = blockIdx.y;
    b.token = pair / k;
    b.expert_row0 = int64_t(ids[pair]) * expert_stride;
  } else if constexpr (kMode == kMoeDown) {
    b.token = blockIdx.y;
    b.expert_row0 = int64_t(ids[b.token * k + part]) * expert_stride;
    b.slot = part;
  }
  return b;
}

// A MoE launch's block rows (blockIdx.y: gate/up's pairs, or down's tokens) and
// the rows each computes (both stacks' d_ff rows, or d_model), and its grid: as
// many units a block row as share the slots.
template <int kMode>
int64_t moe_block_rows(int64_t T, int64_t k) {
  return kMode == kMoeGateUp ? T * k : T;
}
template <int kMode>
int moe_rows(int64_t d_ff, int64_t d_model) {
  return int(kMode == kMoeGateUp ? 2 * d_ff : d_model);
}
inline dim3 moe_grid(int n_units, int64_t slots, int64_t block_rows) {
  const int64_t per_row = slots / block_rows > 1 ? slots / block_rows : 1;
  return dim3(unsigned(n_units < per_row ? n_units : per_row), unsigned(block_rows));
}

// Where the experts' decode keeps its scratch, 256-byte aligned parts: x's
// images of the T tokens (at 0, `x_image` bytes each), the gate/up products
// [2][T k][d_ff] f32, the activations' images (`act_image` bytes each).
struct MoeScratch {
  int64_t products = 0, act_images = 0, total = 0;
};
inline MoeScratch moe_scratch(int64_t T, int64_t k, int64_t d_ff, int64_t x_image, int64_t act_image) {
  auto round = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  MoeScratch s;
  s.products = round(T * x_image);
  s.act_images = s.products + round(2 * T * k * d_ff * int64_t(sizeof(float)));
  s.total = s.act_images + round(T * act_image);
  return s;
}
// Those parts at `scratch`; none (x_images null) unless scratch is 256-byte
// aligned and x 16-byte aligned, as the prepare kernels' copies need.
struct MoeBuffers {
  uint8_t* x_images = nullptr;
  float* products = nullptr;
  uint8_t* act_images = nullptr;
};
inline MoeBuffers moe_buffers(const MoeScratch& s, void* scratch, const float* x) {
  if (reinterpret_cast<uintptr_t>(x) % 16 || reinterpret_cast<uintptr_t>(scratch) % 256) return {};
  uint8_t* base = static_cast<uint8_t*>(scratch);
  return {base, reinterpret_cast<float*>(base + s.products), base + s.act_images};
}

// Where the rows of token column t of the tile at row0 go: y [T, out]; gate/up,
// gate rows to y[0][pair] and up rows to y[1][pair] ([2][pairs][d_ff]); down,
// the block's token's row.
template <int kMode>
__device__ __forceinline__ float* output_row(float* y, int t, int out, int row0, int d_ff, int pairs, int token) {
  if constexpr (kMode == kMoeGateUp)
    return y + (row0 < d_ff ? int64_t(blockIdx.y) : int64_t(pairs) + blockIdx.y - 1) * d_ff;
  else if constexpr (kMode == kMoeDown)
    return y + int64_t(token) * out;
  return y + int64_t(t) * out;
}

// The ring's first kStages - 1 stages, each its own commit group: weights never
// change during a forward, so they load before the kernel waits for its input.
template <int kStages, typename Issue>
__device__ __forceinline__ void issue_first_stages(Issue&& issue, int n_stages) {
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n_stages) issue();
    copy_async_commit();
  }
}

// x's image, staged by the prepare kernel, into the front of shared memory;
// the block waits for it (and for the stages issued before).
__device__ __forceinline__ void load_staged_x(uint8_t* smem, const uint8_t* staged, int64_t bytes) {
  for (int64_t b = int64_t(threadIdx.x) * 16; b < bytes; b += int64_t(blockDim.x) * 16)
    copy_async_16(smem_address(smem + b), staged + b);
  copy_async_commit();
  copy_async_wait<0>();
  __syncthreads();
}

}  // namespace mere::cuda::tiles
