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

float Sampler::next_uniform() {
  uint32_t counter[4] = {uint32_t(draws_), uint32_t(draws_ >> 32), 0, 0}, out[4];
  ++draws_;
  philox4x32(counter, params_.seed, out);
  return float(out[0] >> 8) * (1.0f / 16777216.0f);  // 24 random bits: exact in f32, never 1
}

int32_t Sampler::sample(const float* logits, int64_t vocab, const std::vector<int32_t>& context) {
  MERE_CHECK(vocab > 0, "sample: empty logits");
  const SamplingParams& p = params_;
  std::vector<float>& x = scratch_;
  x.assign(logits, logits + vocab);

  if (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f) {
    std::unordered_set<int32_t> present(context.begin(), context.end());
    for (int32_t id : present) {
      if (id < 0 || id >= vocab) continue;
      float& l = x[size_t(id)];
      if (p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
      l -= p.presence_penalty;
    }
  }

  if (p.is_greedy()) {  // first maximum, as torch.argmax
    return int32_t(std::max_element(x.begin(), x.end()) - x.begin());
  }

  // Candidates sorted by logit, best first; top-k cuts the sort short.
  std::vector<int32_t>& order = order_;
  order.resize(size_t(vocab));
  std::iota(order.begin(), order.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return x[size_t(a)] > x[size_t(b)] || (x[size_t(a)] == x[size_t(b)] && a < b); };
  size_t keep = size_t(vocab);
  if (p.top_k > 0 && p.top_k < vocab) {
    keep = size_t(p.top_k);
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), better);
  } else {
    std::sort(order.begin(), order.end(), better);
  }
  order.resize(keep);

  // Softmax over the candidates at this temperature, in double for the long tail.
  std::vector<double> probs(keep);
  double max_logit = x[size_t(order[0])] / p.temperature, total = 0;
  for (size_t i = 0; i < keep; ++i) total += probs[i] = std::exp(x[size_t(order[i])] / p.temperature - max_logit);
  for (double& q : probs) q /= total;

  if (p.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
    double mass = 0;
    size_t n = 0;
    while (n < keep && mass < p.top_p) mass += probs[n++];
    keep = std::max<size_t>(n, 1);
  }
  if (p.min_p > 0.0f) {
    size_t n = 1;
    while (n < keep && probs[n] >= p.min_p * probs[0]) ++n;
    keep = n;
  }

  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += probs[i];
  double u = double(next_uniform()) * kept, acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += probs[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace mere
