// Same-offset decode batching: several sequences at one position decode in one
// forward (their rows batched through every matmul, each attending to its own
// cache) and get exactly the tokens each gets alone (greedy).
#include <gtest/gtest.h>

#include "models/batch_decode_util.h"
#include "models/model.h"
#include "test_util.h"

namespace mere {
namespace {

using test::BatchComparison;
using test::compare_batch_with_alone;

class BatchDecode : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchDecode, EachSequenceGetsItsTokensAlone) {
  const auto dir = GetParam() == "demo" ? test::source_dir() / "models" / "demo" : test::fixtures_dir() / GetParam();
  auto model = load_model(dir);
  const BatchComparison c = compare_batch_with_alone(*model, 3, 12);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(c.batched[size_t(b)], c.alone[size_t(b)]) << "sequence " << b;
}

// States on one pool: each layer writes the batch's K/V and attends in one call
// over the batch's block tables (the path CUDA runs as one launch), fused
// rope-store (the CPU's composition) or not.
TEST(BatchDecode, OnePoolBatchGetsItsTokensAlone) {
  for (const char* family : {"llama", "qwen3", "qwen3_moe"})
    for (bool fused : {false, true}) {
      auto model = load_model(test::fixtures_dir() / family, Device::cpu, LoadOptions{.fuse_rope_store = fused});
      for (KvCacheMode mode : {KvCacheMode::native, KvCacheMode::affine4}) {
        const BatchComparison c = compare_batch_with_alone(*model, 3, 8, /*one_pool=*/true, mode);
        for (int b = 0; b < 3; ++b)
          EXPECT_EQ(c.batched[size_t(b)], c.alone[size_t(b)])
              << family << " sequence " << b << " fused " << fused << " kv " << kv_cache_mode_name(mode);
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Models, BatchDecode, ::testing::Values("llama", "qwen3", "qwen3_moe", "demo"));

TEST(BatchDecode, SequencesAtDifferentOffsetsAreRefused) {
  auto model = load_model(test::fixtures_dir() / "qwen3");
  auto a = model->make_state(32), b = model->make_state(32);
  model->forward({1, 2, 3}, *a, false);
  model->forward({1, 2}, *b, false);
  EXPECT_THROW(model->forward_batch({4, 5}, {a.get(), b.get()}), Error);
  EXPECT_EQ(a->length(), 3);
  EXPECT_EQ(b->length(), 2);
}

}  // namespace
}  // namespace mere
