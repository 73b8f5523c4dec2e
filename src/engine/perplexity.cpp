#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>

namespace mere {

int64_t perplexity_windows(int64_t n, int64_t ctx, int64_t stride) {
  return n <= ctx ? 1 : (n - ctx + stride - 1) / stride + 1;
}

double PerplexityResult::ppl() const { return scored > 0 ? std::exp(nll_sum / double(scored)) : NAN; }

void check_perplexity_inputs(const Model& model, int64_t n_tokens, int64_t ctx, int64_t stride) {
  MERE_CHECK(ctx >= 2, "perplexity: --ctx must be at least 2, got {}", ctx);
  MERE_CHECK(stride >= 1 && stride <= ctx, "perplexity: --stride must be in [1, ctx={}], got {}", ctx, stride);
  MERE_CHECK(ctx <= model.info().max_positions, "perplexity: --ctx {} exceeds the model's context of {}", ctx,
             model.info().max_positions);
  MERE_CHECK(n_tokens >= 2, "perplexity: the text has {} token(s); at least 2 are needed", n_tokens);
}

PerplexityResult perplexity(const Model& model, const std::vector<int32_t>& ids, int64_t ctx, int64_t stride,
                            const std::function<void(int64_t, int64_t)>& on_window, KvCacheMode kv_mode) {
  const int64_t n = int64_t(ids.size());
  check_perplexity_inputs(model, n, ctx, stride);
  const int64_t vocab = model.info().vocab;
  const int64_t total_windows = perplexity_windows(n, ctx, stride);

  PerplexityResult result;
  int64_t prev_end = 0;
  for (int64_t begin = 0; prev_end < n; begin += stride) {
    const int64_t end = std::min(begin + ctx, n);
    std::vector<int32_t> window(ids.begin() + begin, ids.begin() + end);
    auto state = model.make_state(end - begin, kv_mode);
    Tensor logits = model.forward(window, *state, /*all_logits=*/true).to_device(Device::cpu);  // [end - begin, vocab]
    for (int64_t i = std::max(prev_end, begin + 1); i < end; ++i) {
      const float* row = logits.data<float>() + (i - 1 - begin) * vocab;
      double max_logit = *std::max_element(row, row + vocab), sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - max_logit);
      result.nll_sum += max_logit + std::log(sum) - double(row[ids[size_t(i)]]);
      ++result.scored;
    }
    prev_end = end;
    ++result.windows;
    if (on_window) on_window(result.windows, total_windows);
  }
  return result;
}

}  // namespace mere
