// mere bench --prefix-cache's measurement (engine/prefix_bench): the cold prompt
// misses, the second prompt reuses every whole block it shares (no timing checked).
#include <gtest/gtest.h>

#include "engine/prefix_bench.h"
#include "test_util.h"

namespace mere {
namespace {

TEST(PrefixBench, TheHitReusesTheSharedWholeBlocks) {
  auto model = load_model(test::fixtures_dir() / "llama");
  for (KvCacheMode mode : {KvCacheMode::native, KvCacheMode::affine8}) {
    const PrefixCacheBench r = bench_prefix_cache(*model, 100, 8, 1, mode);
    EXPECT_EQ(r.reused_tokens, 80);  // 92 shared tokens: 5 whole blocks
    EXPECT_GT(r.miss_ms, 0.0);
    EXPECT_GT(r.hit_ms, 0.0);
    EXPECT_NE(r.describe().find("80 reused"), std::string::npos) << r.describe();
  }
  EXPECT_THROW(bench_prefix_cache(*model, 8, 8, 1, KvCacheMode::native), Error);
}

}  // namespace
}  // namespace mere
