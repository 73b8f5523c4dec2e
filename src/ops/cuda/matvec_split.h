// The tensor-core decode matvecs' split-K choice (matvec_tiles.cuh): host
// arithmetic only, so that CPU tests can check the rule.
#pragma once

#include <algorithm>
#include <cstdint>

namespace mere::cuda::tiles {

constexpr int kWarps = 8;      // a block's
constexpr int kTileRows = 16;  // a warp's tile

// Hopper's L1 and shared memory share 256 KB an SM; the driver gives shared
// memory the smallest carveout (KB below) that holds the resident blocks' bytes
// (each block's dynamic shared memory and 1 KB the system reserves), and L1 the rest.
inline int64_t l1_bytes_beside(int64_t blocks_per_sm, int64_t block_smem) {
  constexpr int kCarveoutsKb[] = {0, 8, 16, 32, 64, 100, 132, 164, 196, 228};
  const int64_t smem = blocks_per_sm * (block_smem + 1024);
  for (int kb : kCarveoutsKb)
    if (smem <= int64_t(kb) * 1024) return int64_t(256 - kb) * 1024;
  return 28 * 1024;
}

// The scales and biases that a warp's stages copy through L1 (cp.async.ca): a
// stage takes 4-16 bytes of each row's 128-byte line, and the row's next stages
// read the same line again, so each tile in flight keeps a line of scales and one
// of biases a row in L1, shared by its split warps while they read the same line.
struct FactorLines {
  int blocks_per_sm = 0;
  int lines_per_row = 0;  // 128-byte lines of a row's scales (its biases alike)
  int64_t l1_bytes = 0;   // l1_bytes_beside the resident blocks
  int64_t bytes_in_flight(int split) const {
    return int64_t(blocks_per_sm) * (kWarps / split) * std::min(split, lines_per_row) * kTileRows * 2 * 128;
  }
  // Half of L1: what else the SM reads through it, and lines not evicted in
  // order, need the rest.
  bool fit(int split) const { return 2 * bytes_in_flight(split) <= l1_bytes; }
};

// Split-K: the fewest warps per tile (1 to kWarps) whose units of kWarps / split
// tiles fill the slots (resident blocks) as well as any, each warp keeping at
// least `min_stages` of the row's `row_stages` so that its ring stays full.
// Given `factors`, where that split's factor lines would not fit in L1, the
// fewest more warps whose lines fit: a large matrix's tiles at split 1 in blocks
// that leave L1 small (lm_head at 4 tokens ran at 0.67 of 4.2 TB/s, 0.90 at
// split 8), and at 3-4 tokens Llama-3-8B's qkv and down (the decode step 4%
// faster, though each alone ran 3-11% slower: docs/benchmarks.md, thirty-first
// session). Where no split's lines fit, the most warps the min-stages guard
// allows, whose lines overflow L1 the least (int8 down_proj at 4 tokens: the
// decode step 3% faster, thirty-second session). More warps a tile never fill
// the slots worse (twice the units take at most twice the waves).
inline int split_for(int n_tiles, int row_stages, int64_t slots, int min_stages, const FactorLines* factors = nullptr) {
  int split = 1;
  double best = 0;
  for (int s = 1; s <= kWarps && row_stages / s >= 1; s *= 2) {
    const int64_t units = (n_tiles + kWarps / s - 1) / (kWarps / s);
    const double waves = double((units + slots - 1) / slots);
    const double fill = double(units) / (waves * double(slots));
    if (fill > best * 1.05 && (s == 1 || row_stages / s >= min_stages)) best = fill, split = s;
  }
  if (!factors || factors->fit(split)) return split;
  int most = split;
  for (int s = split * 2; s <= kWarps && row_stages / s >= min_stages; s *= 2) {
    if (factors->fit(s)) return s;
    most = s;
  }
  return most;
}

}  // namespace mere::cuda::tiles
