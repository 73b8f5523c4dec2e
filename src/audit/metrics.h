// The comparisons the audit makes between a baseline and a lever, as plain
// functions over tokens and logits, so each is tested on hand-made inputs.
#pragma once

#include <cstdint>
#include <vector>

namespace mere {

// Two token sequences from the same prompt: how far they agree.
struct TokenParity {
  int64_t matched = 0;            // tokens equal before the first divergence
  int64_t total = 0;              // the baseline's length
  int64_t first_divergence = -1;  // index of the first differing token; -1: none
  int64_t positionwise = 0;       // positions (of the shorter run) holding the same token
};
TokenParity compare_tokens(const std::vector<int32_t>& baseline, const std::vector<int32_t>& lever);

// Over prompts: matched / total (1 when total is 0).
double match_rate(const std::vector<TokenParity>& per_prompt);

// One position's distributions from two sets of logits over the same vocabulary:
// KL(p_baseline || p_lever) in nats, and each side's negative log-likelihood of `target`.
struct PositionCompare {
  double kl = 0, nll_baseline = 0, nll_lever = 0;
};
PositionCompare compare_logits(const float* baseline, const float* lever, int64_t vocab, int32_t target);

// Distribution of per-position KL values.
struct KlStats {
  double mean = 0, p99 = 0, max = 0;
  int64_t count = 0;
  std::vector<double> edges;      // histogram bin edges (log10 spaced, first bin from 0)
  std::vector<int64_t> counts;    // counts[i]: values in [edges[i], edges[i+1])
};
KlStats kl_stats(std::vector<double> values);
// The p-th quantile (0..1) by the nearest-rank rule; NaN for no values.
double quantile(std::vector<double> values, double p);

// Repeated timings: the median and the spread (min, max).
struct Spread {
  double median = 0, min = 0, max = 0;
  int64_t runs = 0;
};
Spread spread_of(std::vector<double> values);

}  // namespace mere
