// Same-offset batching on CUDA: up to kMaxMatvecTokens sequences the decode
// matvecs take every row with the arithmetic of one, so the tokens are those
// of each sequence alone; larger batches run the tensor-core GEMMs, whose sums
// differ in the last bits, and report the match.
#include <gtest/gtest.h>

#include "core/device.h"
#include "models/batch_decode_util.h"
#include "test_util.h"

namespace mere {
namespace {

TEST(BatchDecodeGpu, SequencesGetTheirTokensAlone) {
  if (!cuda_available()) FAIL() << "gpu tests need a GPU: " << cuda_device_description();
  for (const char* family : {"llama", "qwen3", "qwen3_moe", "qwen3_moe-mlx4"}) {
    auto model = load_model(test::fixtures_dir() / family, Device::cuda);
    for (int batch : {3, 8, 12}) {
      const test::BatchComparison c = test::compare_batch_with_alone(*model, batch, 16);
      int same = 0, total = 0;
      for (int b = 0; b < batch; ++b)
        for (size_t i = 0; i < c.alone[size_t(b)].size(); ++i, ++total) same += c.alone[size_t(b)][i] == c.batched[size_t(b)][i];
      std::printf("[ gpu      ] %s batch %d: %d of %d greedy tokens as alone\n", family, batch, same, total);
      if (batch <= 8) EXPECT_EQ(same, total) << family << " batch " << batch;
      else EXPECT_GE(same, total / 2) << family << " batch " << batch;
    }
  }
}

}  // namespace
}  // namespace mere
