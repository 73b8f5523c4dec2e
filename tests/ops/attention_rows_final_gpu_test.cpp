// Decode attention's loads before its wait (ctest label gpu): in a decode step
// (ops::set_cached_rows_final) the GQA kernel reads the position, the page
// tables and the K/V rows of the keys before the forward's first position
// before it waits for the kernel before it, and the newer keys after. The
// output is the same bits either way: one token, five tokens of a prefill
// (whose own keys the kernel must load after the wait), a paged batch of 3, the
// kernel that ropes and stores the new row itself (lever rope_in_attention),
// both block forms, positions on both sides of split edges; and against the
// CPU. A decode step says it for its own launches only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "engine/decode_step.h"
#include "engine/levers.h"
#include "gpu_test_util.h"
#include "models/model.h"
#include "ops/cuda/launchers.h"
#include "ops/ops.h"
#include "sampling/device_sampler.h"
#include "test_util.h"

namespace mere {
namespace {

using test::device_position;
using test::gpu;
using test::random;
using test::relative_error;
using test::same_bytes;

class AttentionRowsFinal : public test::NeedsGpuDefaultLaunch {
 protected:
  void TearDown() override {
    ops::set_cached_rows_final(false);
    ops::set_decode_keys(0);
    ops::set_launch_settings({});
  }
};

TEST_F(AttentionRowsFinal, LoadsBeforeTheWaitGiveTheSameBits) {
  struct Case {
    int64_t heads, kv_heads, head_dim;
    DType cache;
  };
  const Case cases[] = {{32, 8, 128, DType::bf16}, {32, 4, 128, DType::bf16}, {8, 2, 64, DType::f32}};
  const int64_t rows = 1024;  // a sequence's cache rows
  for (const Case& c : cases)
    for (int layout = 0; layout < 3; ++layout)  // one token, five tokens of a prefill, a paged batch of 3
      for (bool wide : {false, true})
        for (int64_t pos : {0, 1, 63, 64, 65, 700}) {
          const int64_t T = layout == 1 ? 5 : 1, B = layout == 2 ? 3 : 1, rows_q = T * B;
          const std::string label = fmt::format("{}/{}x{} {} {} pos {}{}", c.heads, c.kv_heads, c.head_dim,
                                                dtype_name(c.cache), layout == 0   ? "one token"
                                                                     : layout == 1 ? "prefill of 5"
                                                                                   : "paged batch of 3",
                                                pos, wide ? " wide blocks" : "");
          const ops::KvPages pages = test::interleaved_pages(B, rows);
          const Tensor k_pool = random({rows * B, c.kv_heads, c.head_dim}, DType::f32, 1).to(c.cache);
          const Tensor v_pool = random({rows * B, c.kv_heads, c.head_dim}, DType::f32, 2).to(c.cache);
          const Tensor q = random({rows_q, c.heads, c.head_dim}, DType::f32, uint64_t(pos + 3), 2.0f);
          const float scale = 1.0f / std::sqrt(float(c.head_dim));
          const Tensor kc = gpu(k_pool), vc = gpu(v_pool), q_gpu = gpu(q), start = device_position(pos);

          ops::set_launch_settings({.wide_attention_blocks = wide});
          ops::set_decode_keys(pos + T);
          ops::set_cached_rows_final(false);
          const Tensor waits = ops::attention(q_gpu, kc, vc, start, scale, pages).to_device(Device::cpu);
          ops::set_cached_rows_final(true);
          const Tensor early = ops::attention(q_gpu, kc, vc, start, scale, pages).to_device(Device::cpu);
          ops::set_cached_rows_final(false);
          EXPECT_TRUE(same_bytes(early, waits)) << label;

          // The CPU over each sequence's keys (its rows gathered from its blocks).
          const int64_t keys = pos + T;
          Tensor want = Tensor::empty({rows_q, c.heads, c.head_dim}, DType::f32);
          for (int64_t b = 0; b < B; ++b) {
            const Tensor got = ops::attention(q.slice_rows(b * T, (b + 1) * T).clone(),
                                              test::sequence_rows(k_pool, B, b, keys),
                                              test::sequence_rows(v_pool, B, b, keys), pos, scale);
            std::copy_n(got.data<float>(), got.numel(), want.data<float>() + b * T * c.heads * c.head_dim);
          }
          EXPECT_LE(relative_error(early, want, label), 1e-5f) << label;
        }
}

// The kernel that ropes and stores the new row itself takes that key from its
// own copy; the older ones it loads before its wait.
TEST_F(AttentionRowsFinal, RopeInAttentionGivesTheSameBits) {
  const int64_t heads = 32, kv_heads = 8, hd = 128, rows = 1024;
  ops::RopeTable rope;
  for (int i = 0; i < hd / 2; ++i) rope.inv_freq.push_back(std::pow(500000.0f, -2.0f * i / hd));
  const float scale = 1.0f / std::sqrt(float(hd));
  for (int64_t B : {1, 3})
    for (bool wide : {false, true})
      for (int64_t pos : {0, 1, 64, 65, 700}) {
        const std::string label = fmt::format("batch of {} pos {}{}", B, pos, wide ? " wide blocks" : "");
        const ops::KvPages pages = test::interleaved_pages(B, rows);
        const Tensor k_cache = gpu(random({rows * B, kv_heads, hd}, DType::f32, 10).to(DType::bf16));
        const Tensor v_cache = gpu(random({rows * B, kv_heads, hd}, DType::f32, 11).to(DType::bf16));
        const Tensor q = gpu(random({B, heads, hd}, DType::f32, 1, 2.0f));
        const Tensor k = gpu(random({B, kv_heads, hd}, DType::f32, 2, 2.0f));
        const Tensor v = gpu(random({B, kv_heads, hd}, DType::f32, 3));
        ops::set_launch_settings({.rope_in_attention = true, .wide_attention_blocks = wide});
        ops::set_decode_keys(pos + 1);
        ops::AttentionSplits results[2];
        Tensor caches[2][2];
        for (int early = 0; early < 2; ++early) {
          caches[early][0] = k_cache.clone(), caches[early][1] = v_cache.clone();
          ops::set_cached_rows_final(early == 1);
          ASSERT_TRUE(ops::rope_in_attention_unmerged(q, k, v, Tensor(), Tensor(), 1e-6f, rope, device_position(pos),
                                                      caches[early][0], caches[early][1], scale, pages,
                                                      results[early]))
              << label;
        }
        ops::set_cached_rows_final(false);
        EXPECT_TRUE(same_bytes(results[1].max, results[0].max)) << label << " maxima";
        EXPECT_TRUE(same_bytes(results[1].sum, results[0].sum)) << label << " sums";
        EXPECT_TRUE(same_bytes(ops::merge_attention(results[1]), ops::merge_attention(results[0]))) << label;
        EXPECT_TRUE(same_bytes(caches[1][0], caches[0][0])) << label << " k cache";
        EXPECT_TRUE(same_bytes(caches[1][1], caches[0][1])) << label << " v cache";
      }
}

// A decode step says it for its own launches and takes it back after them,
// graphed or not; its tokens are the same either way.
TEST_F(AttentionRowsFinal, SaidByADecodeStepForItsLaunchesOnly) {
  auto model = load_model(test::model_dir("demo"), Device::cuda, Levers{}.load_options(Device::cuda));
  auto decode = [&](bool graphs) {
    auto pool = std::make_shared<BlockPool>(model->kv_layout(), BlockPool::blocks_for_tokens(256));
    SeqState state(pool, 256);
    const Tensor logits = model->forward({5, 17, 29, 41, 53, 65, 77}, state, false);
    EXPECT_FALSE(cuda::cached_rows_final());
    DeviceSampler sampler(SamplingParams{.temperature = 0}, model->info().vocab, 1);
    DecodeStep step(*model, state, sampler, graphs);
    std::vector<int32_t> tokens;
    int ticket = step.begin(logits);
    for (int s = 0; s < 40; ++s) {
      tokens.push_back(step.wait(ticket));
      ticket = step.queue();
      EXPECT_FALSE(cuda::cached_rows_final()) << "after step " << s << (graphs ? " (graphed)" : "");
    }
    return tokens;
  };
  EXPECT_EQ(decode(true), decode(false));
}

}  // namespace
}  // namespace mere
