#include "sampling/sampler.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>

namespace mere {
namespace {

TEST(Philox, MatchesRandom123KnownAnswers) {
  uint32_t out[4];
  uint32_t zeros[4] = {0, 0, 0, 0};
  philox4x32(zeros, 0, out);
  EXPECT_EQ(out[0], 0x6627e8d5u);
  EXPECT_EQ(out[1], 0xe169c58du);
  EXPECT_EQ(out[2], 0xbc57ac4cu);
  EXPECT_EQ(out[3], 0x9b00dbd8u);
  uint32_t ones[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  philox4x32(ones, ~uint64_t(0), out);
  EXPECT_EQ(out[0], 0x408f276du);
  EXPECT_EQ(out[3], 0x6d5451fdu);
  uint32_t pi[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
  philox4x32(pi, 0x299f31d0a4093822ull, out);
  EXPECT_EQ(out[0], 0xd16cfe09u);
  EXPECT_EQ(out[1], 0x94fdccebu);
  EXPECT_EQ(out[2], 0x5001e420u);
  EXPECT_EQ(out[3], 0x24126ea1u);
}

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

std::map<int32_t, int> histogram(SamplingParams params, const std::vector<float>& logits, int n) {
  Sampler s(params);
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) ++counts[s.sample(logits.data(), int64_t(logits.size()), {})];
  return counts;
}

TEST(Sampler, GreedyTakesTheFirstMaximum) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.sample(l.data(), 4, {}), 1);
}

TEST(Sampler, FollowsTheDistributionAtTemperatureOne) {
  std::vector<double> probs = {0.5, 0.25, 0.15, 0.1};
  auto counts = histogram(SamplingParams{}, logits_of(probs), 40000);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(counts[i] / 40000.0, probs[size_t(i)], 0.01) << i;
}

TEST(Sampler, TemperatureSharpens) {
  SamplingParams p;
  p.temperature = 0.5f;  // p^2, renormalised: 0.25/0.3125 = 0.8
  auto counts = histogram(p, logits_of({0.5, 0.25}), 20000);
  EXPECT_NEAR(counts[0] / 20000.0, 0.8, 0.015);
}

TEST(Sampler, TopKTopPMinPCutTheTail) {
  auto l = logits_of({0.5, 0.25, 0.15, 0.1});
  SamplingParams k;
  k.top_k = 2;
  auto ck = histogram(k, l, 20000);
  EXPECT_EQ(ck.count(2) + ck.count(3), 0u);
  EXPECT_NEAR(ck[0] / 20000.0, 2.0 / 3, 0.015);
  SamplingParams tp;
  tp.top_p = 0.7f;  // 0.5 + 0.25 reaches 0.7: keeps two
  auto cp = histogram(tp, l, 5000);
  EXPECT_EQ(cp.count(2) + cp.count(3), 0u);
  EXPECT_GT(cp[1], 0);
  SamplingParams mp;
  mp.min_p = 0.4f;  // keeps p >= 0.2
  auto cm = histogram(mp, l, 5000);
  EXPECT_EQ(cm.count(2) + cm.count(3), 0u);
  EXPECT_GT(cm[1], 0);
}

// The kept set of sampling_weights: indices with a positive weight.
std::vector<int32_t> kept(const std::vector<float>& logits, SamplingParams p) {
  std::vector<double> w;
  sampling_weights(logits.data(), int64_t(logits.size()), p, w);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < w.size(); ++i)
    if (w[i] > 0) ids.push_back(int32_t(i));
  return ids;
}

TEST(Sampler, TopKKeepsTheKLargestTiesToTheLowerId) {
  std::vector<float> l = {1.0f, 2.0f, 2.0f, 2.0f, 0.0f, 2.0f};
  SamplingParams p;
  p.top_k = 2;
  EXPECT_EQ(kept(l, p), (std::vector<int32_t>{1, 2}));
  p.top_k = 4;
  EXPECT_EQ(kept(l, p), (std::vector<int32_t>{1, 2, 3, 5}));
  p.top_k = 5;
  EXPECT_EQ(kept(l, p), (std::vector<int32_t>{0, 1, 2, 3, 5}));
  p.top_k = 6;  // all: same as off
  EXPECT_EQ(kept(l, p).size(), 6u);
}

TEST(Sampler, TopPKeepsWholeGroupsOfEqualProbability) {
  // {p >= 0.4} holds 0.4 < 0.5; {p >= 0.2} holds everything. A sorted prefix
  // would stop after two tokens; the threshold keeps all three ties.
  auto l = logits_of({0.2, 0.4, 0.2, 0.2});
  SamplingParams p;
  p.top_p = 0.5f;
  EXPECT_EQ(kept(l, p), (std::vector<int32_t>{0, 1, 2, 3}));
  p.top_p = 0.39f;  // the best alone reaches it
  EXPECT_EQ(kept(l, p), (std::vector<int32_t>{1}));
  p.top_p = 0.0f;  // never less than the best
  EXPECT_EQ(kept(l, p), (std::vector<int32_t>{1}));
}

TEST(Sampler, TopPCountsMassWithinTopK) {
  auto l = logits_of({0.1, 0.4, 0.3, 0.2});
  SamplingParams p;
  p.top_p = 0.75f;  // 0.4 + 0.3 = 0.7 < 0.75: needs 0.2 too
  EXPECT_EQ(kept(l, p), (std::vector<int32_t>{1, 2, 3}));
  p.top_k = 3;  // renormalised: (0.4 + 0.3) / 0.9 = 0.78 >= 0.75
  EXPECT_EQ(kept(l, p), (std::vector<int32_t>{1, 2}));
}

TEST(Sampler, TopPIsTakenAtTheTemperature) {
  auto l = logits_of({0.6, 0.4});
  SamplingParams p;
  p.top_p = 0.65f;  // at temperature 1 the best holds 0.6: both kept
  EXPECT_EQ(kept(l, p), (std::vector<int32_t>{0, 1}));
  p.temperature = 0.5f;  // 0.36 / 0.52 = 0.69: the best alone
  EXPECT_EQ(kept(l, p), (std::vector<int32_t>{0}));
}

TEST(Sampler, MinPDropsBelowAFractionOfTheBest) {
  auto l = logits_of({0.19, 0.4, 0.2, 0.1, 0.11});
  SamplingParams p;
  p.min_p = 0.45f;  // keeps p >= 0.18
  EXPECT_EQ(kept(l, p), (std::vector<int32_t>{0, 1, 2}));
  p.top_p = 0.5f;  // {p >= 0.2} holds 0.6: the thresholds intersect
  EXPECT_EQ(kept(l, p), (std::vector<int32_t>{1, 2}));
}

TEST(Sampler, WeightsAreRelativeToTheBest) {
  auto l = logits_of({0.25, 0.5, 0.125, 0.125});
  std::vector<double> w;
  sampling_weights(l.data(), 4, SamplingParams{}, w);
  EXPECT_EQ(w[1], 1.0);
  EXPECT_NEAR(w[0], 0.5, 1e-6);
  EXPECT_NEAR(w[2], 0.25, 1e-6);
}

TEST(Sampler, DrawIsTheInverseCdfInIdOrder) {
  auto l = logits_of({0.1, 0.4, 0.2, 0.3});
  SamplingParams p;
  p.seed = 11;
  Sampler s(p);
  std::vector<double> w;
  sampling_weights(l.data(), 4, p, w);
  double total = w[0] + w[1] + w[2] + w[3];
  for (uint64_t draw = 0; draw < 200; ++draw) {
    double target = double(philox_uniform(p.seed, draw)) * total, acc = 0;
    int32_t want = 0;
    while ((acc += w[size_t(want)]) <= target) ++want;
    ASSERT_EQ(s.sample(l.data(), 4, {}), want) << draw;
  }
  EXPECT_EQ(s.draws(), 200u);
}

TEST(Sampler, GreedyDrawsNothing) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  std::vector<float> l = {0.1f, 3.0f};
  s.sample(l.data(), 2, {});
  EXPECT_EQ(s.draws(), 0u);
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  auto l = logits_of({0.3, 0.3, 0.2, 0.2});
  auto draw = [&](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(l.data(), 4, {}));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampler, PenaltiesFollowTheirRules) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;  // 3.0 -> 1.5 (below 2.0); -1 -> -2
  Sampler s(p);
  std::vector<float> l = {3.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.sample(l.data(), 3, {0}), 1);
  SamplingParams q;
  q.temperature = 0;
  q.presence_penalty = 1.5f;  // 3.0 -> 1.5 < 2.0
  Sampler s2(q);
  EXPECT_EQ(s2.sample(l.data(), 3, {0, 0, 0}), 1);
  EXPECT_EQ(s2.sample(l.data(), 3, {}), 0);
}

// NaN passes every comparison: a NaN temperature or penalty made every logit NaN,
// and top-p's walk over groups of equal values never advanced (a hang).
TEST(Sampler, ParametersOutOfRangeAreErrorsNamingTheField) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto message = [](SamplingParams p) -> std::string {
    try {
      Sampler s(p);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  SamplingParams p;
  EXPECT_EQ(message(p), "no error");
  p.temperature = 0;  // greedy
  EXPECT_EQ(message(p), "no error");
  p.temperature = nan;
  EXPECT_EQ(message(p), "sampling: temperature is nan; it must be a finite number");
  p = {};
  p.repetition_penalty = nan;
  EXPECT_EQ(message(p), "sampling: repetition_penalty is nan; it must be a finite number");
  p = {};
  p.presence_penalty = -inf;
  EXPECT_EQ(message(p), "sampling: presence_penalty is -inf; it must be a finite number");
  p = {};
  p.top_p = 1.5f;
  EXPECT_EQ(message(p), "sampling: top_p is 1.5; it must be in [0, 1]");
  p = {};
  p.min_p = nan;
  EXPECT_EQ(message(p), "sampling: min_p is nan; it must be a finite number");
  p = {};
  p.repetition_penalty = 0;
  EXPECT_EQ(message(p), "sampling: repetition_penalty is 0; it must be positive");
  p = {};
  p.top_k = -1;  // off, as vLLM writes it in generation_config.json
  EXPECT_EQ(message(p), "no error");
}

// Logits a broken model gives (NaN, or an infinite maximum) are an error naming a
// token, as torch.multinomial refuses them, and never a hang in top-p's walk.
TEST(Sampler, LogitsWithoutADistributionAreAnError) {
  SamplingParams p;
  p.top_p = 0.9f;
  Sampler s(p);
  std::vector<float> l = {1.0f, std::numeric_limits<float>::quiet_NaN(), 0.5f};
  try {
    s.sample(l.data(), 3, {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 1's is nan"), std::string::npos) << e.what();
  }
  l = {1.0f, std::numeric_limits<float>::infinity(), 0.5f};
  EXPECT_THROW(s.sample(l.data(), 3, {}), Error);
  l = {1.0f, -std::numeric_limits<float>::infinity(), 0.5f};  // a masked token: fine
  EXPECT_NE(s.sample(l.data(), 3, {}), 1);
}

}  // namespace
}  // namespace mere
