// Sliding-window perplexity against a brute-force computation from full logits.
#include "engine/perplexity.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "test_util.h"

namespace mere {
namespace {

double nll_of(const Tensor& logits, int64_t row, int32_t target) {
  int64_t vocab = logits.dim(1);
  double m = -INFINITY, s = 0;
  for (int64_t v = 0; v < vocab; ++v) m = std::max(m, double(logits.at(row * vocab + v)));
  for (int64_t v = 0; v < vocab; ++v) s += std::exp(double(logits.at(row * vocab + v)) - m);
  return m + std::log(s) - double(logits.at(row * vocab + target));
}

TEST(Perplexity, WindowsScoreEachTokenOnceWithItsWindowContext) {
  auto model = load_model(test::fixtures_dir() / "qwen3");
  auto ref = nlohmann::json::parse(test::read_file(test::fixtures_dir() / "qwen3" / "reference.json"));
  std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();  // 24 tokens
  const int64_t ctx = 10, stride = 4, n = int64_t(ids.size());
  // Brute force: windows start at 0, 4, 8, ...; window [b, b+10) scores tokens not yet scored.
  double want = 0;
  int64_t scored = 0, prev_end = 0;
  for (int64_t b = 0; prev_end < n; b += stride) {
    int64_t e = std::min(b + ctx, n);
    auto state = model->make_state();
    Tensor logits = model->forward({ids.begin() + b, ids.begin() + e}, *state, true);
    for (int64_t i = std::max(prev_end, b + 1); i < e; ++i, ++scored) want += nll_of(logits, i - 1 - b, ids[size_t(i)]);
    prev_end = e;
  }
  PerplexityResult r = perplexity(*model, ids, ctx, stride);
  EXPECT_EQ(r.scored, n - 1);
  EXPECT_EQ(scored, n - 1);
  EXPECT_EQ(r.windows, perplexity_windows(n, ctx, stride));
  EXPECT_NEAR(r.nll_sum, want, 1e-6 * want);
  // One window over everything equals the mean NLL of a single forward.
  PerplexityResult whole = perplexity(*model, ids, n, n);
  EXPECT_EQ(whole.windows, 1);
  EXPECT_LT(whole.ppl(), r.ppl() * 10);
  EXPECT_THROW(perplexity(*model, ids, 1, 1), Error);
  EXPECT_THROW(perplexity(*model, ids, 8, 9), Error);
}

}  // namespace
}  // namespace mere
