// Perplexity over a token sequence with a sliding window, as transformers'
// perplexity guide and llama.cpp's tool compute it: windows of `ctx` tokens
// starting every `stride` tokens; each window scores only the tokens the
// previous window did not, each given every earlier token of its window.
#pragma once

#include <functional>
#include <vector>

#include "models/model.h"

namespace mere {

struct PerplexityResult {
  double nll_sum = 0;   // natural log
  int64_t scored = 0;   // tokens scored
  int64_t windows = 0;
  double ppl() const;
};

// Number of windows perplexity() runs over n tokens.
int64_t perplexity_windows(int64_t n, int64_t ctx, int64_t stride);

// The errors perplexity() gives for its inputs, for a caller to raise before it shows progress.
void check_perplexity_inputs(const Model& model, int64_t n_tokens, int64_t ctx, int64_t stride);

// `on_window(done, total)` reports progress.
PerplexityResult perplexity(const Model& model, const std::vector<int32_t>& ids, int64_t ctx, int64_t stride,
                            const std::function<void(int64_t, int64_t)>& on_window = {},
                            KvCacheMode kv_mode = KvCacheMode::native);

}  // namespace mere
