// The tensor-core decode matvecs' choice of split-K (ops/cuda/matvec_split.h),
// host arithmetic, on the H200's numbers: 132 SMs, Llama-3-8B's matrices at
// g64 (16 stages a row of 4096 columns), the blocks' shared memory as launched.
#include <gtest/gtest.h>

#include "ops/cuda/matvec_split.h"

namespace mere::cuda::tiles {
namespace {

constexpr int64_t kKb = 1024;

TEST(MatvecSplit, L1IsWhatTheSharedMemoryCarveoutLeaves) {
  EXPECT_EQ(l1_bytes_beside(2, 84160), 60 * kKb);   // int4 at one token: 2 x 82 KB, the 196 KB carveout
  EXPECT_EQ(l1_bytes_beside(2, 104960), 28 * kKb);  // 4 tokens in two digits: 2 x 103 KB, 228 KB
  EXPECT_EQ(l1_bytes_beside(1, 142336), 92 * kKb);  // 8 tokens in two digits: one block, 164 KB
  EXPECT_EQ(l1_bytes_beside(1, 0), 248 * kKb);      // the 1 KB a block reserves takes the 8 KB carveout
  EXPECT_EQ(l1_bytes_beside(3, 80 * kKb), 28 * kKb);
}

TEST(MatvecSplit, LargeMatricesSplitUntilTheirFactorLinesFitInL1) {
  const int lm_head_tiles = 128256 / kTileRows, stages = 16, min_stages = 2;
  // Two blocks an SM: at split 1 each of a block's 8 tiles keeps 16 rows x 2
  // lines (64 KB an SM).
  const FactorLines one_token{2, 1, 60 * kKb}, four_tokens{2, 1, 28 * kKb}, eight_tokens{1, 1, 92 * kKb};
  EXPECT_EQ(one_token.bytes_in_flight(1), 64 * kKb);
  EXPECT_EQ(split_for(lm_head_tiles, stages, 264, min_stages), 1);  // fills the slots as well as any
  EXPECT_EQ(split_for(lm_head_tiles, stages, 264, min_stages, &one_token), 4);     // 16 KB in 60
  EXPECT_EQ(split_for(lm_head_tiles, stages, 264, min_stages, &four_tokens), 8);   // 8 KB in 28
  EXPECT_EQ(split_for(lm_head_tiles, stages, 132, min_stages, &eight_tokens), 1);  // 32 KB in 92
  // Splits the fill already chose stay where their lines fit: gate_up and o (8),
  // qkv at one token (4); qkv at 4 tokens (16 KB, over half of 28) takes 8.
  EXPECT_EQ(split_for(28672 / kTileRows, stages, 264, min_stages, &four_tokens), 8);
  EXPECT_EQ(split_for(4096 / kTileRows, stages, 264, min_stages, &one_token), 8);
  EXPECT_EQ(split_for(6144 / kTileRows, stages, 264, min_stages, &one_token), 4);
  EXPECT_EQ(split_for(6144 / kTileRows, stages, 264, min_stages, &four_tokens), 8);
  // down_proj's rows hold 4 lines of factors each: at 4 tokens (int4: one block
  // an SM, 60 KB of L1) split 4's 32 KB do not fit, split 8's 16 KB do. int8's
  // one block of 198 KB leaves 28 KB, where no split fits: the most warps a
  // tile (8: 16 KB, the least overflow) rather than the fill's 4. In two-block
  // launches (28 KB) the fill already takes 8.
  const FactorLines down_four_tokens{1, 4, 60 * kKb}, down_int8_four_tokens{1, 4, 28 * kKb},
      down_two_blocks{2, 4, 28 * kKb};
  EXPECT_EQ(split_for(4096 / kTileRows, 56, 132, min_stages), 4);
  EXPECT_EQ(split_for(4096 / kTileRows, 56, 132, min_stages, &down_four_tokens), 8);
  EXPECT_EQ(split_for(4096 / kTileRows, 56, 132, min_stages, &down_int8_four_tokens), 8);
  EXPECT_EQ(split_for(4096 / kTileRows, 56, 264, min_stages, &down_two_blocks), 8);
  // A warp keeps at least min_stages of a row: 8 stages allow split 4 at most,
  // which fits 60 KB; in 28 KB no allowed split fits, and split 4 overflows the
  // least.
  EXPECT_EQ(split_for(lm_head_tiles, 8, 264, min_stages, &one_token), 4);
  EXPECT_EQ(split_for(lm_head_tiles, 8, 264, min_stages, &four_tokens), 4);
  // Where the guard allows no more warps than the fill's, the fill's split stays.
  EXPECT_EQ(split_for(lm_head_tiles, 3, 264, min_stages, &four_tokens), 1);
}

}  // namespace
}  // namespace mere::cuda::tiles
