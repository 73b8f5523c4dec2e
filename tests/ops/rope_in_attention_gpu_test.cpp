// Lever rope_in_attention (ctest label gpu): the decode attention kernel that
// applies the q/k norm and RoPE itself and writes the new K/V row gives the same
// bits as qk_norm_rope_store then attention_unmerged (partials and cache), for a
// contiguous cache, a paged sequence and paged batches of 3 and 8 (groups up to
// 4 heads; larger groups, and batches over 4, decline unless in the 8-warp
// blocks of lever wide_attention_blocks, where a grid that fits a wave runs
// them), in both block forms and on the tensor cores (lever
// tensor_core_attention, where the 4-warp form runs), bf16/f16/f32 caches,
// with and without q/k norms, rotate-half and interleaved, partial rotary dims,
// at positions on both sides of split edges; it declines (nothing run) where it
// does not apply; and a model's decode step with it is one kernel a layer
// shorter, its logits the same bits. Its speed against the two kernels is
// printed, not asserted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "engine/levers.h"
#include "gpu_test_util.h"
#include "models/model.h"
#include "ops/ops.h"
#include "test_util.h"

namespace mere {
namespace {

using test::device_position;
using test::device_table;
using test::gpu;
using test::same_bytes;
using test::random;

class RopeInAttention : public test::NeedsGpuDefaultLaunch {};

struct Case {
  int64_t heads, kv_heads, head_dim;
  DType cache;
  DType norm;  // u8: no q/k norm
  bool interleaved;
  int rotary_dim;  // 0: the whole head
};

TEST_F(RopeInAttention, EqualsRopeStoreThenAttentionBitForBit) {
  const Case cases[] = {
      {32, 8, 128, DType::bf16, DType::u8, false, 0},   // Llama-3-8B
      {16, 8, 128, DType::bf16, DType::bf16, false, 0},  // Qwen3: q/k norms
      {8, 1, 64, DType::f16, DType::f32, true, 0},      // a group of 8, interleaved pairs
      {4, 4, 64, DType::f32, DType::u8, false, 32},     // no grouping, half the head rotated
      {6, 2, 128, DType::bf16, DType::f16, false, 0},   // a group of 3 in a block of 4 heads
  };
  for (const Case& c : cases) {
    ops::RopeTable rope;
    const int rot = c.rotary_dim ? c.rotary_dim : int(c.head_dim);
    for (int i = 0; i < rot / 2; ++i) rope.inv_freq.push_back(std::pow(500000.0f, -2.0f * i / rot));
    rope.attention_factor = 1.03f;
    rope.interleaved = c.interleaved;
    const bool norm = c.norm != DType::u8;
    const Tensor qn = norm ? gpu(random({c.head_dim}, c.norm, 4, 0.2f, 1.0f)) : Tensor();
    const Tensor kn = norm ? gpu(random({c.head_dim}, c.norm, 5, 0.2f, 1.0f)) : Tensor();
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    // Both attention block forms (lever wide_attention_blocks); these shapes'
    // splits fit a wave, so the wide one runs at every position. Where the
    // 4-warp form runs, also on the tensor cores (lever tensor_core_attention).
    for (int form = 0; form < 3; ++form)
    for (int layout = 0; layout < 4; ++layout) {
      const bool wide = form == 2, tensor_cores = form == 1;
      // Cache rows: the split count is fixed by them, as in a graph. The tensor
      // cores take splits of more than 64 keys: a long cache past its splits'.
      const int64_t rows = tensor_cores ? 8192 : 1024;
      if (tensor_cores && layout == 3) continue;  // a batch of 8 declines in the 4-warp form
      const std::vector<int64_t> positions =
          tensor_cores ? std::vector<int64_t>{2200, 4100, 8000} : std::vector<int64_t>{0, 1, 63, 64, 65, 200, 1000};  // contiguous, one paged sequence, paged batches of 3 and 8
      const int64_t B = layout == 2 ? 3 : layout == 3 ? 8 : 1;
      bool ran = false;  // a batch of 8
      for (int64_t pos : positions) {
        ops::KvPages pages;
        if (layout > 0)
          for (int64_t b = 0; b < B; ++b) {  // rows / 16 blocks each, scrambled and interleaved with the others'
            std::vector<int32_t> blocks;
            for (int64_t j = 0; j < rows / 16; ++j) blocks.push_back(int32_t(((j * 7) % (rows / 16)) * B + b));
            pages.tables.push_back(device_table(blocks));
          }
        const int64_t storage = rows * B;
        Tensor k_cache = gpu(random({storage, c.kv_heads, c.head_dim}, DType::f32, 10).to(c.cache));
        Tensor v_cache = gpu(random({storage, c.kv_heads, c.head_dim}, DType::f32, 11).to(c.cache));
        Tensor k_cache2 = k_cache.clone(), v_cache2 = v_cache.clone();
        const Tensor k_cache_before = k_cache.to_device(Device::cpu);
        const Tensor q = gpu(random({B, c.heads, c.head_dim}, DType::f32, 1, 2.0f));
        const Tensor k = gpu(random({B, c.kv_heads, c.head_dim}, DType::f32, 2, 2.0f));
        const Tensor v = gpu(random({B, c.kv_heads, c.head_dim}, DType::f32, 3));
        const std::string label =
            fmt::format("{}/{}x{} {} cache{}{}{} {} pos {}", c.heads, c.kv_heads, c.head_dim, dtype_name(c.cache),
                        norm ? " norm" : "", c.interleaved ? " interleaved" : "",
                        c.rotary_dim ? " partial rotary" : "", layout == 0 ? "contiguous" : layout == 1 ? "paged" : "batch",
                        pos) + (wide ? " wide blocks" : "") + (tensor_cores ? " tensor cores" : "") +
                            (B > 1 ? fmt::format(" of {}", B) : "");

        ops::set_decode_keys(pos + 1);
        ops::set_launch_settings({.tensor_core_attention = tensor_cores, .wide_attention_blocks = wide});
        Tensor q_rotated = q.clone();
        ops::qk_norm_rope_store(q_rotated, k, v, qn, kn, 1e-6f, rope, device_position(pos), k_cache, v_cache, pages);
        ops::AttentionSplits want;
        ASSERT_TRUE(ops::attention_unmerged(q_rotated, k_cache, v_cache, device_position(pos), scale, pages, want)) << label;
        ops::AttentionSplits off;
        EXPECT_FALSE(ops::rope_in_attention_unmerged(q, k, v, qn, kn, 1e-6f, rope, device_position(pos), k_cache2, v_cache2,
                                                     scale, pages, off))
            << label << ": ran with the lever off";

        ops::set_launch_settings(
            {.tensor_core_attention = tensor_cores, .rope_in_attention = true, .wide_attention_blocks = wide});
        ops::AttentionSplits got;
        // Batches keep the two kernels where groups exceed 4 heads, unless in 8-warp
        // blocks; batches of 5-8 run it only in 8-warp blocks whose grid fits a wave.
        const bool must_decline = B > 1 && c.heads / c.kv_heads > 4 && !wide;
        if (must_decline || B > 4) {
          const bool took = ops::rope_in_attention_unmerged(q, k, v, qn, kn, 1e-6f, rope, device_position(pos), k_cache2,
                                                            v_cache2, scale, pages, got);
          if (!took) {
            ops::set_launch_settings({});
            EXPECT_TRUE(same_bytes(k_cache2, k_cache_before)) << label << " k cache written";
            continue;
          }
          EXPECT_TRUE(!must_decline && wide) << label << ": ran";
          ran = true;
        } else {
          ASSERT_TRUE(ops::rope_in_attention_unmerged(q, k, v, qn, kn, 1e-6f, rope, device_position(pos), k_cache2,
                                                      v_cache2, scale, pages, got))
              << label;
        }
        ops::set_launch_settings({});
        EXPECT_TRUE(same_bytes(got.max, want.max)) << label << " maxima";
        EXPECT_TRUE(same_bytes(got.sum, want.sum)) << label << " sums";
        // Splits past the visible keys leave their outputs unwritten: compare the merged result.
        EXPECT_TRUE(same_bytes(ops::merge_attention(got), ops::merge_attention(want))) << label << " outputs";
        EXPECT_TRUE(same_bytes(k_cache2, k_cache)) << label << " k cache";
        EXPECT_TRUE(same_bytes(v_cache2, v_cache)) << label << " v cache";
      }
      // In 8-warp blocks a batch of 8 runs it at the short positions (every group here).
      if (B == 8) {
        EXPECT_EQ(ran, wide) << c.heads << "/" << c.kv_heads << " batch of 8";
      }
    }
  }
}

// Where it does not apply it runs nothing and says so: a prefill (T > 1 of one
// sequence), head_dim 256, a group of 16 heads, a batch of 5 sequences, a rotary
// table longer than the head, and the CPU. Rows that do not fit (k of 3 heads
// for q of 8, a cache of other rows) are an error.
TEST_F(RopeInAttention, DeclinesWhereItDoesNotApply) {
  ops::set_launch_settings({.rope_in_attention = true});
  ops::RopeTable rope;
  for (int i = 0; i < 32; ++i) rope.inv_freq.push_back(std::pow(10000.0f, -i / 32.0f));
  struct Shape {
    int64_t T, heads, kv_heads, head_dim;
  };
  for (Shape s : {Shape{4, 8, 2, 64}, Shape{1, 4, 2, 256}, Shape{1, 16, 1, 64}}) {
    Tensor kc = Tensor::zeros({64, s.kv_heads, s.head_dim}, DType::bf16, Device::cuda), vc = kc.clone();
    Tensor before = kc.to_device(Device::cpu);
    ops::AttentionSplits out;
    EXPECT_FALSE(ops::rope_in_attention_unmerged(
        gpu(random({s.T, s.heads, s.head_dim}, DType::f32, 1)), gpu(random({s.T, s.kv_heads, s.head_dim}, DType::f32, 2)),
        gpu(random({s.T, s.kv_heads, s.head_dim}, DType::f32, 3)), Tensor(), Tensor(), 1e-6f, rope, device_position(5), kc, vc,
        0.125f, {}, out))
        << "T " << s.T << " " << s.heads << "/" << s.kv_heads << "x" << s.head_dim;
    EXPECT_TRUE(same_bytes(kc, before)) << "the cache was written";
  }
  {
    const int64_t B = 5;
    ops::KvPages pages;
    for (int64_t b = 0; b < B; ++b) pages.tables.push_back(device_table({int32_t(b)}));
    Tensor kc = Tensor::zeros({16 * B, 2, 64}, DType::bf16, Device::cuda), vc = kc.clone();
    ops::AttentionSplits out;
    EXPECT_FALSE(ops::rope_in_attention_unmerged(gpu(random({B, 8, 64}, DType::f32, 1)),
                                                 gpu(random({B, 2, 64}, DType::f32, 2)),
                                                 gpu(random({B, 2, 64}, DType::f32, 3)), Tensor(), Tensor(), 1e-6f,
                                                 rope, device_position(5), kc, vc, 0.125f, pages, out))
        << "a batch of " << B;
  }
  {  // a rotary table longer than the head (the kernel's angle table holds head_dim / 2)
    ops::RopeTable too_long;
    for (int i = 0; i < 48; ++i) too_long.inv_freq.push_back(std::pow(10000.0f, -i / 48.0f));
    Tensor kc = Tensor::zeros({64, 2, 64}, DType::bf16, Device::cuda), vc = kc.clone();
    ops::AttentionSplits out;
    EXPECT_FALSE(ops::rope_in_attention_unmerged(gpu(random({1, 8, 64}, DType::f32, 1)),
                                                 gpu(random({1, 2, 64}, DType::f32, 2)),
                                                 gpu(random({1, 2, 64}, DType::f32, 3)), Tensor(), Tensor(), 1e-6f,
                                                 too_long, device_position(5), kc, vc, 0.125f, {}, out))
        << "a rotary table of 96 dims for heads of 64";
  }
  {  // rows that do not fit are an error that names them, not a decline
    Tensor kc = Tensor::zeros({64, 2, 64}, DType::bf16, Device::cuda), vc = kc.clone();
    ops::AttentionSplits out;
    const Tensor q = gpu(random({1, 8, 64}, DType::f32, 1)), v = gpu(random({1, 2, 64}, DType::f32, 3));
    EXPECT_THROW(ops::rope_in_attention_unmerged(q, gpu(random({1, 3, 64}, DType::f32, 2)), v, Tensor(), Tensor(),
                                                 1e-6f, rope, device_position(5), kc, vc, 0.125f, {}, out),
                 Error);
    Tensor short_rows = Tensor::zeros({64, 2, 32}, DType::bf16, Device::cuda);
    EXPECT_THROW(ops::rope_in_attention_unmerged(q, gpu(random({1, 2, 64}, DType::f32, 2)), v, Tensor(), Tensor(),
                                                 1e-6f, rope, device_position(5), short_rows, short_rows, 0.125f, {}, out),
                 Error);
  }
  Tensor kc = Tensor::zeros({64, 2, 64}, DType::f32), vc = kc.clone();
  ops::AttentionSplits out;
  EXPECT_FALSE(ops::rope_in_attention_unmerged(random({1, 8, 64}, DType::f32, 1), random({1, 2, 64}, DType::f32, 2),
                                               random({1, 2, 64}, DType::f32, 3), Tensor(), Tensor(), 1e-6f, rope,
                                               device_position(5).to_device(Device::cpu), kc, vc, 0.125f, {}, out));
  ops::set_launch_settings({});
}

// Speed, printed and not asserted: the two kernels against the one, each in a
// graph of 50 with programmatic launch, for Llama-3-8B's heads (groups of 4) and
// Qwen3-30B-A3B's (groups of 8, q/k norms), 1-4 sequences, at 64 and 1024 keys.
TEST_F(RopeInAttention, TimingAgainstTheTwoKernels) {
  struct Shape {
    const char* name;
    int64_t heads, kv_heads;
    bool norm;
  };
  for (Shape s : {Shape{"llama3-8b", 32, 8, false}, Shape{"qwen3-30b-a3b", 32, 4, true}})
    for (int64_t B : {1, 2, 4})
      for (int64_t pos : {63, 1023}) {
        const int64_t hd = 128, rows = 4096;
        ops::RopeTable rope;
        for (int i = 0; i < hd / 2; ++i) rope.inv_freq.push_back(std::pow(500000.0f, -2.0f * i / hd));
        ops::KvPages pages;
        for (int64_t b = 0; b < B; ++b) {
          std::vector<int32_t> blocks;
          for (int64_t j = 0; j < rows / 16; ++j) blocks.push_back(int32_t(j * B + b));
          pages.tables.push_back(device_table(blocks));
        }
        if (B == 1) pages = {};
        Tensor kc = gpu(random({rows * B, s.kv_heads, hd}, DType::f32, 1).to(DType::bf16)), vc = kc.clone();
        const Tensor q = gpu(random({B, s.heads, hd}, DType::f32, 2)), k = gpu(random({B, s.kv_heads, hd}, DType::f32, 3));
        const Tensor v = gpu(random({B, s.kv_heads, hd}, DType::f32, 4)), p = device_position(pos);
        const Tensor qn = s.norm ? gpu(random({hd}, DType::bf16, 5, 0.2f, 1.0f)) : Tensor(), kn = s.norm ? qn : Tensor();
        Tensor q_rotated = q.clone();
        ops::set_launch_settings({.programmatic = true});
        const double two = test::seconds_per_launch([&] {
          ops::qk_norm_rope_store(q_rotated, k, v, qn, kn, 1e-6f, rope, p, kc, vc, pages);
          ops::AttentionSplits splits;
          ops::attention_unmerged(q_rotated, kc, vc, p, 0.088f, pages, splits);
        });
        ops::set_launch_settings({.programmatic = true, .rope_in_attention = true});
        bool ran = true;
        const double one = test::seconds_per_launch([&] {
          ops::AttentionSplits splits;
          ran = ops::rope_in_attention_unmerged(q, k, v, qn, kn, 1e-6f, rope, p, kc, vc, 0.088f, pages, splits);
        });
        ops::set_launch_settings({});
        const std::string fused = ran ? fmt::format("{:6.2f} us", one * 1e6) : std::string("declined");
        std::printf("[ timing   ] %-14s B=%lld %5lld keys: rope/store + attention %6.2f us, in one kernel %s\n", s.name,
                    static_cast<long long>(B), static_cast<long long>(pos + 1), two * 1e6, fused.c_str());
      }
}

// The fixtures (Llama without q/k norms, Qwen3 with them, Qwen3-MoE unfolded):
// 24 decode steps give the same logits, bit for bit, with the lever on and off,
// and a step launches one kernel fewer per layer with it, besides any merge
// kernel the two-kernel path launches where the fused one merges in clusters.
TEST_F(RopeInAttention, ModelDecodeIsTheSameBitsWithOneKernelFewerALayer) {
  for (const char* family : {"llama", "qwen3", "qwen3_moe"}) {
    test::FixtureDecode runs[2];
    for (int on = 0; on < 2; ++on) {
      Levers levers = Levers::from_env();
      levers.rope_in_attention = on == 1;
      runs[on] = test::decode_fixture(family, levers);
    }
    std::printf("[ gpu      ] %s decode step kernels: rope_in_attention off %zu (%zu merges), on %zu (%zu merges), "
                "%lld layers\n", family, runs[0].step_kernels, runs[0].merge_kernels, runs[1].step_kernels,
                runs[1].merge_kernels, static_cast<long long>(runs[0].layers));
    EXPECT_EQ(runs[0].step_kernels - runs[0].merge_kernels - (runs[1].step_kernels - runs[1].merge_kernels),
              size_t(runs[0].layers))
        << family;
    ASSERT_EQ(runs[0].logits.size(), runs[1].logits.size());
    for (size_t s = 0; s < runs[0].logits.size(); ++s)
      EXPECT_TRUE(same_bytes(runs[0].logits[s], runs[1].logits[s])) << family << " step " << s;
  }
}

}  // namespace
}  // namespace mere
