#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_set>

#include "core/error.h"

namespace mere {

void philox4x32(const uint32_t counter[4], uint64_t key, uint32_t out[4]) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(kMul0) * c0, p1 = uint64_t(kMul1) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c0 = n0;
    c1 = uint32_t(p1);
    c2 = n2;
    c3 = uint32_t(p0);
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

float philox_uniform(uint64_t seed, uint64_t draw) {
  uint32_t counter[4] = {uint32_t(draw), uint32_t(draw >> 32), 0, 0}, out[4];
  philox4x32(counter, seed, out);
  return float(out[0] >> 8) * (1.0f / 16777216.0f);  // 24 random bits: exact in f32, never 1
}

void SamplingParams::check() const {
  auto finite = [](const char* field, float v) {
    MERE_CHECK(std::isfinite(v), "sampling: {} is {}; it must be a finite number", field, v);
  };
  finite("temperature", temperature);
  finite("top_p", top_p);
  finite("min_p", min_p);
  finite("repetition_penalty", repetition_penalty);
  finite("presence_penalty", presence_penalty);
  MERE_CHECK(top_p >= 0.0f && top_p <= 1.0f, "sampling: top_p is {}; it must be in [0, 1]", top_p);
  MERE_CHECK(min_p >= 0.0f && min_p <= 1.0f, "sampling: min_p is {}; it must be in [0, 1]", min_p);
  MERE_CHECK(repetition_penalty > 0.0f, "sampling: repetition_penalty is {}; it must be positive", repetition_penalty);
  // top_k below 1 is off (vLLM writes -1 for that, transformers 0), so it needs no check.
}

float penalised_logit(float logit, const SamplingParams& p) {
  double l = logit;  // l * penalty is exact in double, so no fused multiply-add can change the result
  if (p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
  return float(l - p.presence_penalty);
}

void sampling_weights(const float* logits, int64_t vocab, const SamplingParams& p, std::vector<double>& weights) {
  MERE_CHECK(vocab > 0, "sampling_weights: empty logits");
  MERE_CHECK(!p.is_greedy(), "sampling_weights: temperature {} is greedy", p.temperature);
  const size_t n = size_t(vocab);
  const float max_logit = *std::max_element(logits, logits + n), inv_t = 1.0f / p.temperature;
  std::vector<float> z(n);
  for (size_t i = 0; i < n; ++i) {
    z[i] = (logits[i] - max_logit) * inv_t;
    MERE_CHECK(!std::isnan(z[i]), "sample: the logits give no distribution: token {}'s is {}, the largest {}", i,
               logits[i], max_logit);
  }

  std::vector<char> kept(n, 1);
  if (p.top_k > 0 && p.top_k < vocab) {
    std::vector<int32_t> ids(n);
    std::iota(ids.begin(), ids.end(), 0);
    auto better = [&](int32_t a, int32_t b) { return z[size_t(a)] > z[size_t(b)] || (z[size_t(a)] == z[size_t(b)] && a < b); };
    std::nth_element(ids.begin(), ids.begin() + (p.top_k - 1), ids.end(), better);
    std::fill(kept.begin(), kept.end(), 0);
    for (int j = 0; j < p.top_k; ++j) kept[size_t(ids[size_t(j)])] = 1;
  }

  // Weights in double, for the long tail.
  weights.assign(n, 0.0);
  double top_k_mass = 0;
  for (size_t i = 0; i < n; ++i)
    if (kept[i]) top_k_mass += weights[i] = std::exp(double(z[i]));

  if (p.top_p < 1.0f) {
    // Walk the distinct values of z downwards, a whole group of equal z at a time,
    // until the mass above the threshold reaches top_p.
    std::vector<int32_t> ids;
    for (size_t i = 0; i < n; ++i)
      if (kept[i]) ids.push_back(int32_t(i));
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return z[size_t(a)] > z[size_t(b)]; });
    const double target = double(p.top_p) * top_k_mass;
    float tau = z[size_t(ids.back())];
    double mass = 0;
    for (size_t j = 0; j < ids.size();) {
      const float group = z[size_t(ids[j])];
      for (; j < ids.size() && z[size_t(ids[j])] == group; ++j) mass += weights[size_t(ids[j])];
      if (mass >= target) {
        tau = group;
        break;
      }
    }
    for (size_t i = 0; i < n; ++i)
      if (z[i] < tau) weights[i] = 0;
  }

  if (p.min_p > 0.0f) {
    const double best = 1.0;  // exp(0): the maximum's weight
    for (double& w : weights)
      if (w < double(p.min_p) * best) w = 0;
  }
}

int32_t Sampler::sample(const float* logits, int64_t vocab, const std::vector<int32_t>& context) {
  MERE_CHECK(vocab > 0, "sample: empty logits");
  const SamplingParams& p = params_;
  std::vector<float>& x = scratch_;
  x.assign(logits, logits + vocab);

  if (p.has_penalties()) {
    std::unordered_set<int32_t> present(context.begin(), context.end());
    for (int32_t id : present)
      if (id >= 0 && id < vocab) x[size_t(id)] = penalised_logit(x[size_t(id)], p);
  }

  if (p.is_greedy()) {  // first maximum, as torch.argmax
    return int32_t(std::max_element(x.begin(), x.end()) - x.begin());
  }

  std::vector<double>& w = weights_;
  sampling_weights(x.data(), vocab, p, w);
  double total = 0;
  for (double v : w) total += v;
  // Inverse CDF in id order: the GPU finds the same token with a prefix sum.
  const double target = double(philox_uniform(p.seed, draws_++)) * total;
  double acc = 0;
  int32_t last = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] == 0) continue;
    acc += w[i];
    last = int32_t(i);
    if (acc > target) return last;
  }
  return last;  // only if rounding left the target at the very end
}

}  // namespace mere
