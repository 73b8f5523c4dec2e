#include "audit/metrics.h"

#include <algorithm>
#include <cmath>

namespace mere {

TokenParity compare_tokens(const std::vector<int32_t>& baseline, const std::vector<int32_t>& lever) {
  TokenParity p;
  p.total = int64_t(baseline.size());
  const size_t n = std::min(baseline.size(), lever.size());
  for (size_t i = 0; i < n; ++i) {
    if (baseline[i] == lever[i]) ++p.positionwise;
    else if (p.first_divergence < 0) p.first_divergence = int64_t(i);
  }
  // A run that stops early diverges where it stops.
  if (p.first_divergence < 0 && baseline.size() != lever.size()) p.first_divergence = int64_t(n);
  p.matched = p.first_divergence < 0 ? p.total : p.first_divergence;
  return p;
}

double match_rate(const std::vector<TokenParity>& per_prompt) {
  int64_t matched = 0, total = 0;
  for (const TokenParity& p : per_prompt) {
    matched += p.matched;
    total += p.total;
  }
  return total > 0 ? double(matched) / double(total) : 1.0;
}

PositionCompare compare_logits(const float* baseline, const float* lever, int64_t vocab, int32_t target) {
  // log-softmax of each side in double: log p = x - max - log(sum exp(x - max)).
  auto log_normalizer = [vocab](const float* x) {
    const double m = *std::max_element(x, x + vocab);
    double s = 0;
    for (int64_t v = 0; v < vocab; ++v) s += std::exp(double(x[v]) - m);
    return m + std::log(s);
  };
  const double zb = log_normalizer(baseline), zl = log_normalizer(lever);
  PositionCompare c;
  for (int64_t v = 0; v < vocab; ++v) {
    const double lpb = double(baseline[v]) - zb, lpl = double(lever[v]) - zl;
    c.kl += std::exp(lpb) * (lpb - lpl);
  }
  c.kl = std::max(c.kl, 0.0);  // rounding can leave -1e-17 for identical rows
  c.nll_baseline = zb - double(baseline[target]);
  c.nll_lever = zl - double(lever[target]);
  return c;
}

double quantile(std::vector<double> values, double p) {
  if (values.empty()) return NAN;
  std::sort(values.begin(), values.end());
  const size_t rank = size_t(std::ceil(p * double(values.size())));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

KlStats kl_stats(std::vector<double> values) {
  KlStats s;
  s.count = int64_t(values.size());
  // Bins: [0, 1e-8), then decades up to 10 nats, then [10, inf).
  s.edges = {0};
  for (int e = -8; e <= 1; ++e) s.edges.push_back(std::pow(10.0, e));
  s.counts.assign(s.edges.size(), 0);
  if (values.empty()) return s;
  double sum = 0;
  for (double v : values) {
    sum += v;
    s.max = std::max(s.max, v);
    const size_t bin = size_t(std::upper_bound(s.edges.begin(), s.edges.end(), v) - s.edges.begin()) - 1;
    ++s.counts[bin];
  }
  s.mean = sum / double(values.size());
  s.p99 = quantile(std::move(values), 0.99);
  return s;
}

Spread spread_of(std::vector<double> values) {
  Spread s;
  s.runs = int64_t(values.size());
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  s.median = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  s.min = values.front();
  s.max = values.back();
  return s;
}

}  // namespace mere
