#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

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

}  // namespace
}  // namespace mere
