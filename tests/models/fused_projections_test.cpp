// The fused_projections lever on the CPU (the same code path the GPU runs):
// structural (one concatenated weight per layer, same bytes) and numerical
// (logits equal to the unfused model's).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/llama.h"
#include "test_util.h"

namespace mere {
namespace {

TEST(FusedProjections, SameBytesOneWeightAndIdenticalLogits) {
  for (const char* family : {"llama", "qwen2", "qwen3"}) {
    auto dir = test::fixtures_dir() / family;
    auto ref = nlohmann::json::parse(test::read_file(dir / "reference.json"));
    std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
    auto plain = load_model(dir, Device::cpu);
    auto fused = load_model(dir, Device::cpu, LoadOptions{.fuse_projections = true});
    EXPECT_TRUE(fused->info().options.fuse_projections);
    EXPECT_EQ(fused->decode_bytes(100), plain->decode_bytes(100)) << family;
    auto s1 = plain->make_state(), s2 = fused->make_state();
    Tensor a = plain->forward(ids, *s1, true), b = fused->forward(ids, *s2, true);
    // Each output row is the same dot product in the same order: bit-identical.
    EXPECT_EQ(test::max_abs_diff(a, b).diff, 0.0f) << family;
    Tensor a1 = plain->forward({7}, *s1, false), b1 = fused->forward({7}, *s2, false);
    EXPECT_EQ(test::max_abs_diff(a1, b1).diff, 0.0f) << family << " decode";
  }
}

}  // namespace
}  // namespace mere
