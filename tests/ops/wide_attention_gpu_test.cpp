// Lever wide_attention_blocks (ctest label gpu): the GQA decode kernel in
// blocks of 8 warps, with the fewest heads a block, where the splits with keys
// fit one wave of one block an SM. Its output matches the CPU and the 4-warp
// blocks, for groups of 1 to 8 heads, head_dim 32-128, bf16/f16/f32 caches,
// one sequence and a paged batch, at key counts on both sides of the forms'
// edges; the launch takes the threads and blocks the rule says and narrows the
// decode step's key range to the counts that choose the same form; and a
// graphed decode whose context crosses an edge captures a graph per form and
// gives the eager decode's tokens.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "core/device.h"
#include "engine/levers.h"
#include "gpu_test_util.h"
#include "models/model.h"
#include "ops/cuda/launchers.h"
#include "ops/ops.h"
#include "test_util.h"

namespace mere {
namespace {

using test::device_position;
using test::gpu;
using test::random;
using test::relative_error;
using test::sm_count;

class WideAttentionBlocks : public test::NeedsGpuDefaultLaunch {};

// The GQA attention kernel's launch in a capture of `run`.
test::KernelLaunch gqa_launch(const std::function<void()>& run) {
  return test::launch_named(run, {"attention_gqa_kernel"});
}

TEST_F(WideAttentionBlocks, MatchTheCpuAndTheFourWarpBlocks) {
  const int64_t rows = 4096;  // cache rows a sequence: the graph's split count
  for (const test::AttentionShape& c : test::attention_shapes())
    for (int64_t B : {1, 3})
      for (int64_t keys : {1, 64, 65, 128, 129, 256, 257, 512, 513, 1024, 1025, 2112, 2113, 2500}) {
        const std::string label =
            fmt::format("{}/{}x{} {} B={} keys={}", c.heads, c.kv_heads, c.head_dim, dtype_name(c.cache), B, keys);
        // The batch's sequences on one pool; the CPU reads each one's keys gathered from its blocks.
        const test::PagedAttentionStep step = test::paged_attention_step(c, B, rows, keys);
        const ops::KvPages& pages = step.pages;
        const Tensor& want = step.want;
        const float scale = step.scale;

        const Tensor kc = gpu(step.k_pool), vc = gpu(step.v_pool), q_gpu = gpu(step.q), pos = device_position(keys - 1);
        auto attend = [&] { return ops::attention(q_gpu, kc, vc, pos, scale, pages); };
        ops::set_launch_settings({});
        const Tensor four = attend();
        ops::set_launch_settings({.wide_attention_blocks = true});
        ops::set_decode_keys(keys);
        const Tensor wide = attend();
        const ops::KeyCountRange range = ops::decode_keys_range();
        // The attention kernel's shape in a capture of the same launch.
        ops::set_decode_keys(keys);
        const test::KernelLaunch launch = gqa_launch([&] { attend(); });
        ops::set_decode_keys(0);
        ops::set_launch_settings({});

        EXPECT_LE(relative_error(wide, want, label), 1e-5f) << label;
        EXPECT_LE(relative_error(wide, four.to_device(Device::cpu), label + " against 4 warps", false), 2e-6f) << label;

        // The rule (gpu_test_util.h): 8 warps where the splits with keys fit a
        // wave, with the fewest heads a block, and the fewest splits that hold
        // the keys; the key range narrowed to the counts deciding alike.
        const test::WideAttentionGrid want_grid =
            test::wide_attention_grid(B, c.heads, c.kv_heads, keys, cuda::attention_splits(rows, c.kv_heads));
        const int64_t group = c.heads / c.kv_heads, hb = want_grid.heads;
        const int64_t want_blocks = c.kv_heads * (hb ? (group + hb - 1) / hb : 1);
        EXPECT_EQ(launch.block.x, hb ? 256u : 128u) << label;
        EXPECT_EQ(launch.grid.x, unsigned(want_blocks)) << label;
        EXPECT_EQ(launch.grid.z, unsigned(want_grid.splits)) << label;
        EXPECT_EQ(range.lo, want_grid.lo) << label;
        EXPECT_EQ(range.hi, want_grid.hi) << label;
      }
}

// A launch told fewer keys than its step sees (as a graph replayed outside the
// key counts it was captured for would be): the wide grid's last block takes
// the keys past it, so the output is still every key's.
TEST_F(WideAttentionBlocks, AStepPastItsKeyCountStillSeesEveryKey) {
  // Qwen3-30B-A3B's heads, one sequence of a 4,096-row cache seeing 3,000 keys.
  const test::PagedAttentionStep step = test::paged_attention_step({32, 4, 128, DType::bf16}, 1, 4096, 3000);
  ops::set_launch_settings({.wide_attention_blocks = true});
  ops::set_decode_keys(64);  // one-head blocks, a grid of one split
  const Tensor got = ops::attention(gpu(step.q), gpu(step.k_pool), gpu(step.v_pool), device_position(2999), step.scale);
  ops::set_decode_keys(0);
  EXPECT_LE(relative_error(got, step.want, "3,000 keys told 64"), 1e-5f);
}

// Without a key count (a prefill, or a caller that does not say) the form is
// the one for the whole cache; with the lever off it is always 4 warps, and
// the key range is left whole.
TEST_F(WideAttentionBlocks, UnknownKeysTakeTheCacheWideForm) {
  const int64_t heads = 32, kv_heads = 8, hd = 128;
  for (int64_t rows : {64, 4096})
    for (bool lever : {false, true}) {
      const Tensor kc = gpu(random({rows, kv_heads, hd}, DType::f32, 1).to(DType::bf16)), vc = kc.clone();
      const Tensor q = gpu(random({1, heads, hd}, DType::f32, 2)), pos = device_position(40);
      ops::set_launch_settings({.wide_attention_blocks = lever});
      ops::set_decode_keys(lever ? 0 : 41);
      ops::attention(q, kc, vc, pos, 0.088f);  // the allocator's sizes, before the capture
      const test::KernelLaunch launch = gqa_launch([&] { ops::attention(q, kc, vc, pos, 0.088f); });
      const ops::KeyCountRange range = ops::decode_keys_range();
      ops::set_decode_keys(0);
      ops::set_launch_settings({});
      // 64 rows: one split, wide (one-head blocks) at any context; 4096: 33 splits, more than a wave holds.
      EXPECT_EQ(launch.block.x, lever && rows == 64 ? 256u : 128u) << rows << " rows, lever " << lever;
      EXPECT_EQ(range.lo, 1);
      EXPECT_EQ(range.hi, INT64_MAX);
    }
}

// The demo model (6 heads on 2 kv heads, head_dim 64) in a batch of 8 on one
// pool (one attention launch for the batch): one-head blocks make 48 blocks a
// split, two splits a wave: a grid of one split up to 64 keys, two up to 128;
// then two-head blocks (32 a split, four a wave) up to 256 keys, four-head
// blocks (16 a split, eight a wave) up to 512, and the 4-warp form from 513.
// Graphed, the decode
// captures a graph for each form and replays them; its tokens are the eager
// decode's, which picks the form every step.
TEST_F(WideAttentionBlocks, DecodeCapturesAGraphPerForm) {
  auto model = load_model(test::model_dir("demo"), Device::cuda, Levers{}.load_options(Device::cuda));
  ASSERT_TRUE(model->info().options.wide_attention_blocks);
  const int64_t batch = 8;
  struct Case {
    int64_t prompt, steps, captures;
  };
  for (const Case c : {Case{40, 100, 3},     // 41-64, 65-128, 129-140 keys
                       Case{500, 24, 2}}) {  // 501-512, then 513 on
    int64_t graphed_captures = 0, eager_captures = 0;
    const auto graphed = test::decode_batch(*model, batch, c.prompt, c.steps, 1024, true, &graphed_captures);
    const auto eager = test::decode_batch(*model, batch, c.prompt, c.steps, 1024, false, &eager_captures);
    EXPECT_EQ(graphed, eager) << c.prompt;
    EXPECT_EQ(graphed_captures, c.captures) << c.prompt;
    EXPECT_EQ(eager_captures, 0);
  }
}

}  // namespace
}  // namespace mere
