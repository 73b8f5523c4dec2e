// Lever cluster_attention_merge (ctest label gpu): where the 8-warp decode
// attention blocks of lever wide_attention_blocks run over at most 2 splits
// (4 for one row whose partials would otherwise take the merge kernel), the
// splits of a head form a thread-block cluster and merge through
// distributed shared memory, writing the output themselves. Checked: the output
// matches the CPU and the partials merged by the merge kernel, for groups of 3
// to 8 heads, head_dim 32-128, bf16/f16/f32 caches, one sequence and a paged
// batch, at key counts on both sides of the wide form's edge; where the form
// does not apply the partials come back as before; no merge kernel runs where
// it does; rope_in_attention's form gives the same output and caches; an MLX
// affine o_proj takes the merged output on the tensor cores from the formed
// input's size floor; and a model's decode is one kernel a layer shorter with
// the same logits (within f32 reordering) and, graphed, the eager decode's tokens.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "engine/levers.h"
#include "gpu_test_util.h"
#include "models/model.h"
#include "ops/cuda/launchers.h"
#include "ops/ops.h"
#include "ops/quantized_ops.h"
#include "test_util.h"

namespace mere {
namespace {

using test::device_position;
using test::gpu;
using test::random;
using test::relative_error;
using test::same_bytes;
using test::sm_count;

class ClusterAttentionMerge : public test::NeedsGpuDefaultLaunch {};


// Whether the splits merge in clusters: the wide form runs (its rule,
// test::wide_attention_grid) and its grid holds at most 2 splits, or 4 for one
// row where a cluster saves the merge kernel (attention.cu's kMaxClusterSplits
// and kMaxClusterSplitsSavingAKernel).
bool expect_merged(int64_t B, int64_t heads, int64_t kv_heads, int64_t keys, int64_t splits,
                   bool saves_merge_kernel = false) {
  const test::WideAttentionGrid grid = test::wide_attention_grid(B, heads, kv_heads, keys, splits);
  return grid.heads > 0 && grid.splits <= (B == 1 && saves_merge_kernel ? 4 : 2);
}

bool launches_kernel(const std::function<void()>& run, const std::string& name) {
  for (const test::KernelLaunch& k : test::kernel_launches_by(run))
    if (k.name.find(name) != std::string::npos) return true;
  return false;
}

TEST_F(ClusterAttentionMerge, MatchesTheMergeKernelAndTheCpu) {
  int merged_cases = 0, partial_cases = 0;
  for (const test::AttentionShape& c : test::attention_shapes())
    // Cache rows a sequence, which set the graph's split count: 2 splits, or more than a wave holds.
    for (int64_t rows : {128, 4096})
      for (int64_t B : {1, 3})
        for (int64_t keys : {1, 63, 64, 65, 128, 130, 256, 257, 1000}) {
          if (keys > rows) continue;
          const std::string label = fmt::format("{}/{}x{} {} rows={} B={} keys={}", c.heads, c.kv_heads, c.head_dim,
                                                dtype_name(c.cache), rows, B, keys);
          const test::PagedAttentionStep step = test::paged_attention_step(c, B, rows, keys);
          const ops::KvPages& pages = step.pages;
          const float scale = step.scale;

          const Tensor kc = gpu(step.k_pool), vc = gpu(step.v_pool), q_gpu = gpu(step.q);
          const Tensor pos = device_position(keys - 1);
          auto unmerged = [&](bool lever) {
            ops::set_launch_settings({.wide_attention_blocks = true, .cluster_attention_merge = lever});
            ops::set_decode_keys(keys);
            ops::AttentionSplits s;
            EXPECT_TRUE(ops::attention_unmerged(q_gpu, kc, vc, pos, scale, pages, s)) << label;
            return s;
          };
          const ops::AttentionSplits partials = unmerged(false);
          const Tensor merge_kernel = ops::merge_attention(partials).to_device(Device::cpu);
          const ops::AttentionSplits got = unmerged(true);
          // The merged-output form of the same op, and whether it launches the merge kernel.
          const Tensor direct = ops::attention(q_gpu, kc, vc, pos, scale, pages);
          const bool merge_launched =
              launches_kernel([&] { ops::attention(q_gpu, kc, vc, pos, scale, pages); }, "attention_merge_kernel");
          ops::set_decode_keys(0);
          ops::set_launch_settings({});

          const int64_t splits = cuda::attention_splits(rows, c.kv_heads);
          const bool merged = expect_merged(B, c.heads, c.kv_heads, keys, splits);
          EXPECT_EQ(got.merged.defined(), merged) << label;
          EXPECT_EQ(got.max.defined(), !merged) << label << ": partials";
          // The partials say which splits the grid wrote: the wide grid's, or all.
          const test::WideAttentionGrid grid = test::wide_attention_grid(B, c.heads, c.kv_heads, keys, splits);
          EXPECT_EQ(partials.live, grid.heads ? grid.splits : splits) << label << ": live splits";
          // attention() merges the output itself: one row's clusters may be wider there.
          EXPECT_EQ(merge_launched, !expect_merged(B, c.heads, c.kv_heads, keys, splits, true))
              << label << ": merge kernel";
          (merged ? merged_cases : partial_cases)++;
          // Only the order of the splits' f32 sums differs from the merge kernel's.
          EXPECT_LE(relative_error(ops::merge_attention(got), merge_kernel, label + " against the merge kernel", false),
                    1e-6f)
              << label;
          EXPECT_LE(relative_error(direct, merge_kernel, label + " attention()", false), 1e-6f) << label;
          EXPECT_LE(relative_error(direct, step.want, label), 1e-5f) << label;
        }
  EXPECT_GT(merged_cases, 0);
  EXPECT_GT(partial_cases, 0);  // long contexts keep the 4-warp form and its merge kernel
}

// rope_in_attention's kernel (q/k norm, RoPE and the K/V store inside
// attention) merges in clusters too: the same output as its partials merged,
// the same cache bytes.
TEST_F(ClusterAttentionMerge, RopeInAttentionMergesToo) {
  const int64_t heads = 16, kv_heads = 4, hd = 128, rows = 128;  // 2 splits: they merge in a cluster
  ops::RopeTable rope;
  for (int i = 0; i < hd / 2; ++i) rope.inv_freq.push_back(std::pow(500000.0f, -2.0f * i / hd));
  const Tensor qn = gpu(random({hd}, DType::bf16, 4, 0.2f, 1.0f)), kn = gpu(random({hd}, DType::bf16, 5, 0.2f, 1.0f));
  const float scale = 1.0f / std::sqrt(float(hd));
  for (int64_t B : {1, 4})
    for (int64_t pos : {0, 1, 64, 65, 127}) {
      const std::string label = fmt::format("B={} pos {}", B, pos);
      const ops::KvPages pages = test::interleaved_pages(B, rows);
      const Tensor k_cache = gpu(random({rows * B, kv_heads, hd}, DType::f32, 10).to(DType::bf16));
      const Tensor v_cache = gpu(random({rows * B, kv_heads, hd}, DType::f32, 11).to(DType::bf16));
      const Tensor q = gpu(random({B, heads, hd}, DType::f32, 1, 2.0f));
      const Tensor k = gpu(random({B, kv_heads, hd}, DType::f32, 2, 2.0f));
      const Tensor v = gpu(random({B, kv_heads, hd}, DType::f32, 3));
      auto attend = [&](bool lever, Tensor& kc, Tensor& vc) {
        ops::set_launch_settings({.rope_in_attention = true, .wide_attention_blocks = true,
                                  .cluster_attention_merge = lever});
        ops::set_decode_keys(pos + 1);
        ops::AttentionSplits s;
        EXPECT_TRUE(ops::rope_in_attention_unmerged(q, k, v, qn, kn, 1e-6f, rope, device_position(pos), kc, vc, scale,
                                                    pages, s))
            << label;
        ops::set_decode_keys(0);
        ops::set_launch_settings({});
        return s;
      };
      Tensor k_off = k_cache.clone(), v_off = v_cache.clone(), k_on = k_cache.clone(), v_on = v_cache.clone();
      const ops::AttentionSplits off = attend(false, k_off, v_off);
      const ops::AttentionSplits on = attend(true, k_on, v_on);
      EXPECT_TRUE(on.merged.defined()) << label;
      const Tensor want = ops::merge_attention(off).to_device(Device::cpu);
      EXPECT_LE(relative_error(ops::merge_attention(on), want, label), 1e-6f) << label;
      EXPECT_TRUE(same_bytes(k_on, k_off)) << label << " k cache";
      EXPECT_TRUE(same_bytes(v_on, v_off)) << label << " v cache";
    }
}

// The merged output into an MLX affine o_proj keeps the formed input's size
// floor: Qwen3-30B-A3B's o_proj (2^23 weights, below the plain input's 2^24)
// runs on the tensor cores at one token, as when its prepare kernel merged the
// partials (through the plain linear_add it took the CUDA cores and an add
// kernel: 4.7% slower decode).
TEST_F(ClusterAttentionMerge, MergedOutputKeepsTheFormedInputFloor) {
  const int64_t heads = 32, hd = 128, in = heads * hd, out = 2048;
  const Weight w(test::random_affine(out, in, 4, 64, DType::bf16, 7), in);
  const Weight wg = w.to_device(Device::cuda);
  const Tensor a = random({1, heads, hd}, DType::f32, 8);
  const Tensor residual = random({1, out}, DType::f32, 9), bias = random({out}, DType::f32, 10, 0.1f);
  Tensor want = residual.clone();
  ops::add_inplace(want, ops::linear(a.reshape({1, in}), w.dequantize(DType::f32), bias));
  ops::AttentionSplits s;
  s.merged = gpu(a);
  ops::set_launch_settings({.tensor_core_affine_matvec = true});
  EXPECT_FALSE(ops::cuda::affine_matvec_on_tensor_cores(wg.affine(), in, 1, false));  // a plain input: below it
  Tensor h = gpu(residual), via_ops = gpu(residual);
  EXPECT_TRUE(ops::cuda::affine_attention_linear_add(h, s, wg.affine(), gpu(bias)));
  ops::attention_linear_add(via_ops, s, wg, gpu(bias));
  ops::set_launch_settings({});
  EXPECT_LE(relative_error(h, want, "o_proj of the merged output"), 1e-5f);
  EXPECT_TRUE(same_bytes(via_ops, h));
}

// A model's decode (the qwen2 fixture: groups of 4 heads, the wide form at its
// short contexts): one kernel a layer fewer, the logits within f32 reordering.
// A cache of 128 rows gives two splits; 256 rows four, which merge in a cluster
// only because this unfolded decode would otherwise merge them with a kernel
// (attend_cached's merged_by_kernel).
TEST_F(ClusterAttentionMerge, DecodeDropsTheMergeKernel) {
  Levers off;
  off.cluster_attention_merge = false;
  for (int64_t rows : {128, 256}) {
    const test::FixtureDecode want = test::decode_fixture("qwen2", off, rows);
    const test::FixtureDecode got = test::decode_fixture("qwen2", Levers{}, rows);
    ASSERT_EQ(got.logits.size(), want.logits.size()) << rows;
    for (size_t i = 0; i < got.logits.size(); ++i)
      EXPECT_LE(relative_error(got.logits[i], want.logits[i], fmt::format("qwen2 rows {} step {}", rows, i), false),
                1e-5f)
          << i;
    EXPECT_EQ(got.step_kernels + size_t(got.layers), want.step_kernels) << rows;
  }
}

// Graphed and eager decodes of the demo model (groups of 3) in a batch of 8 with
// the lever on give the same tokens: the cluster launch is captured and replayed.
TEST_F(ClusterAttentionMerge, GraphedDecodeMatchesEager) {
  auto model = load_model(test::model_dir("demo"), Device::cuda, Levers{}.load_options(Device::cuda));
  ASSERT_TRUE(model->info().options.cluster_attention_merge);
  const int64_t batch = 8, prompt = 40, steps = 24;
  EXPECT_EQ(test::decode_batch(*model, batch, prompt, steps, 256, true),
            test::decode_batch(*model, batch, prompt, steps, 256, false));
}

}  // namespace
}  // namespace mere
