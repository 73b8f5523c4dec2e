// Lever tensor_core_attention (ctest label gpu): decode attention over a dense
// bf16/f16 cache on the tensor cores past 1,024 keys (or its splits' 64 keys
// each, where fewer), whichever CUDA-core form would run, where the grid fits a
// wave of two blocks an SM. Its output matches the CPU and the CUDA-core kernel for the
// attention forms' shapes, one sequence and a paged batch of 2, at key counts
// on both sides of the forms' and the 16-key steps' edges up to 6,000 keys; it
// runs exactly where it applies (head_dim 64 or 128, bf16 or f16) on the wide
// form's grid where that would run, else the cache's splits, and narrows the
// decode step's key range to the counts that choose alike; a step told fewer
// keys than it sees still attends to all; rows past the visible keys are never
// read (NaN-poisoned);
// and the demo model's graphed decode across the edge captures a graph per side
// and gives the CUDA-core kernel's tokens.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
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

class TensorCoreAttention : public test::NeedsGpuDefaultLaunch {};

// The attention kernel a capture of `run` launches (the GQA or the mma one).
test::KernelLaunch attention_launch(const std::function<void()>& run) {
  return test::launch_named(run, {"attention_gqa_kernel", "attention_mma_kernel"});
}

TEST_F(TensorCoreAttention, MatchesTheCpuAndTheCudaCoreKernel) {
  const int64_t rows = 8192;  // cache rows a sequence: the graph's split count
  for (const test::AttentionShape& c : test::attention_shapes())
    for (int64_t B : {1, 2})
      for (int64_t keys : {1, 17, 65, 1000, 1024, 1025, 2112, 2113, 2129, 2500, 4096, 4097, 4111, 6000}) {
        const std::string label =
            fmt::format("{}/{}x{} {} B={} keys={}", c.heads, c.kv_heads, c.head_dim, dtype_name(c.cache), B, keys);
        const test::PagedAttentionStep step = test::paged_attention_step(c, B, rows, keys);
        const Tensor kc = gpu(step.k_pool), vc = gpu(step.v_pool), q = gpu(step.q), pos = device_position(keys - 1);
        auto attend = [&] { return ops::attention(q, kc, vc, pos, step.scale, step.pages); };
        ops::set_decode_keys(keys);
        ops::set_launch_settings({.wide_attention_blocks = true});
        const Tensor cuda_cores = attend();
        ops::set_launch_settings({.tensor_core_attention = true, .wide_attention_blocks = true});
        const Tensor tensor_cores = attend();
        const ops::KeyCountRange range = ops::decode_keys_range();
        ops::set_decode_keys(keys);
        const test::KernelLaunch launch = attention_launch([&] { attend(); });
        ops::set_decode_keys(0);
        ops::set_launch_settings({});

        EXPECT_LE(relative_error(tensor_cores, step.want, label), 1e-5f) << label;
        EXPECT_LE(relative_error(tensor_cores, cuda_cores.to_device(Device::cpu), label + " against CUDA cores", false),
                  1e-5f)
            << label;
        // Where it applies: past 1,024 keys (or 64 a split, where fewer), head_dim
        // 64/128, bf16/f16, a grid of blocks of 8 heads that fits 2 an SM.
        const int64_t splits = cuda::attention_splits(rows, c.kv_heads), group = c.heads / c.kv_heads;
        const bool fits = (c.head_dim == 64 || c.head_dim == 128) &&
                          (c.cache == DType::bf16 || c.cache == DType::f16) &&
                          c.kv_heads * ((group + 7) / 8) * B * splits <= 2 * test::sm_count();
        const int64_t from = std::min<int64_t>(64 * splits, 1024);
        const bool applies = fits && keys > from;
        EXPECT_EQ(launch.name.find("attention_mma_kernel") != std::string::npos, applies) << label;
        if (fits) {  // the key counts deciding alike (the wide form's grid may narrow them further)
          EXPECT_EQ(range.lo > from, applies) << label;
          EXPECT_EQ(range.hi > from, applies) << label;
        }
        if (applies) {
          EXPECT_EQ(launch.block.x, 128u) << label;
          EXPECT_EQ(launch.grid.x, unsigned(c.kv_heads * ((group + 7) / 8))) << label;
          EXPECT_EQ(launch.grid.y, unsigned(B)) << label;
          // The wide form's grid where that would run (its splits hold every key).
          const test::WideAttentionGrid wide = test::wide_attention_grid(B, c.heads, c.kv_heads, keys, splits);
          EXPECT_EQ(launch.grid.z, unsigned(wide.heads > 0 ? wide.splits : splits)) << label;
        }
      }
}

// On the wide form's grid of fewer splits than the partials, a step told fewer
// keys than it sees (a graph replayed outside its key counts) still attends to
// every key: the grid's last block takes the rest, and the partials past the
// grid are marked empty for the merge.
TEST_F(TensorCoreAttention, AStepPastItsKeyCountStillSeesEveryKey) {
  // Qwen3-30B-A3B's heads, one sequence of an 8,192-row cache seeing 3,000 keys.
  const test::PagedAttentionStep step = test::paged_attention_step({32, 4, 128, DType::bf16}, 1, 8192, 3000);
  const Tensor kc = gpu(step.k_pool), vc = gpu(step.v_pool), q = gpu(step.q), pos = device_position(2999);
  ops::set_launch_settings({.tensor_core_attention = true, .wide_attention_blocks = true});
  ops::set_decode_keys(1100);  // 64 splits of the cache, a wide grid of 32 (up to 2,048 keys)
  ops::attention(q, kc, vc, pos, step.scale);  // the allocator's sizes, before the capture
  ops::set_decode_keys(1100);
  const test::KernelLaunch launch = attention_launch([&] { ops::attention(q, kc, vc, pos, step.scale); });
  ops::set_decode_keys(1100);
  const Tensor got = ops::attention(q, kc, vc, pos, step.scale);
  ops::set_decode_keys(0);
  ops::set_launch_settings({});
  EXPECT_NE(launch.name.find("attention_mma_kernel"), std::string::npos);
  EXPECT_EQ(launch.grid.z, 32u);
  EXPECT_LE(relative_error(got, step.want, "3,000 keys told 1,100"), 1e-5f);
}

// Rows past the visible keys hold NaN: the kernel never reads them, at key
// counts that end inside a 16-key step and a split.
TEST_F(TensorCoreAttention, NeverReadsPastTheVisibleKeys) {
  const int64_t heads = 32, kv_heads = 8, hd = 128, rows = 4096;
  for (int64_t keys : {3001, 3007, 3024}) {
    Tensor k = random({rows, kv_heads, hd}, DType::f32, 1), v = random({rows, kv_heads, hd}, DType::f32, 2);
    const Tensor q = random({1, heads, hd}, DType::f32, 3, 2.0f);
    const float scale = 1.0f / std::sqrt(float(hd));
    const Tensor want =
        ops::attention(q, k.slice_rows(0, keys).clone(), v.slice_rows(0, keys).clone(), keys - 1, scale);
    for (int64_t i = keys * kv_heads * hd; i < k.numel(); ++i)
      k.data<float>()[i] = v.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
    const Tensor kc = gpu(k.to(DType::bf16)), vc = gpu(v.to(DType::bf16)), q_gpu = gpu(q);
    const Tensor pos = device_position(keys - 1);
    ops::set_launch_settings({.tensor_core_attention = true});
    ops::set_decode_keys(keys);  // past 33 splits of 64 keys
    const Tensor got = ops::attention(q_gpu, kc, vc, pos, scale);
    ops::set_decode_keys(keys);
    const test::KernelLaunch launch = attention_launch([&] { ops::attention(q_gpu, kc, vc, pos, scale); });
    ops::set_decode_keys(0);
    ops::set_launch_settings({});
    EXPECT_NE(launch.name.find("attention_mma_kernel"), std::string::npos) << keys;
    // The CPU's f32 rows against the GPU's bf16 copy of them: bf16's rounding.
    EXPECT_LE(relative_error(got, want, fmt::format("NaN past {} keys", keys)), 1e-2f) << keys;
  }
}

// The demo model (6 heads on 2 kv heads, head_dim 64) in a batch of 2 on one
// pool, 4,160 tokens a sequence (64 splits of 64 keys: 256 blocks, a wave of
// two an SM): the wide form runs up to 2,112 keys (wide_attention_gpu_test.cpp),
// then the 4-warp form; with the lever the tensor cores past 1,024 instead.
// Graphed across that edge, the decode captures a graph for each side, and with
// the lever its greedy tokens are the CUDA-core kernel's.
TEST_F(TensorCoreAttention, DemoDecodeFollowsTheCudaCoreKernel) {
  Levers on = Levers{}, off = Levers{};
  on.tensor_core_attention = true;
  off.tensor_core_attention = false;
  auto with = load_model(test::model_dir("demo"), Device::cuda, on.load_options(Device::cuda));
  auto without = load_model(test::model_dir("demo"), Device::cuda, off.load_options(Device::cuda));
  ASSERT_TRUE(with->info().options.tensor_core_attention);
  int64_t captures = 0;
  const auto got = test::decode_batch(*with, 2, 1012, 24, 4160, true, &captures);  // 1,013-1,036 keys
  const auto want = test::decode_batch(*without, 2, 1012, 24, 4160, true);
  EXPECT_EQ(got, want);
  EXPECT_EQ(captures, 2);
}

}  // namespace
}  // namespace mere
