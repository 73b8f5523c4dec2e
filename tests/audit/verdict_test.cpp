// The promotion policy (docs/levers.md, "The gate's policy") on hand-made figures.
#include <gtest/gtest.h>

#include "audit/verdict.h"

namespace mere {
namespace {

// A lever identical to the baseline in every measured way.
LeverFigures same() {
  LeverFigures f;
  f.greedy_match_rate = 1;
  f.ppl_baseline = f.ppl_lever = 20;
  f.decode_baseline = f.decode_lever = f.decode_lever_min = f.decode_lever_max = 100;
  f.prefill_baseline = f.prefill_lever = f.prefill_lever_min = f.prefill_lever_max = 1000;
  f.resident_baseline = f.resident_lever = 1e9;
  return f;
}

TEST(Verdict, ParityWithoutAGainIsRefused) {
  const Verdict v = decide(same());
  EXPECT_EQ(v.verdict, "refuse");
  EXPECT_EQ(v.quality, "parity");
  EXPECT_NE(v.reason.find("no measured gain"), std::string::npos) << v.reason;
}

TEST(Verdict, ParityAndFasterIsPromoted) {
  LeverFigures f = same();
  f.decode_lever = 110, f.decode_lever_min = 105, f.decode_lever_max = 112;
  const Verdict v = decide(f);
  EXPECT_EQ(v.verdict, "promote") << v.reason;
  EXPECT_TRUE(v.faster);
  EXPECT_NE(v.reason.find("decode +10.0%"), std::string::npos) << v.reason;
}

TEST(Verdict, ParityAndSmallerIsPromoted) {
  LeverFigures f = same();
  f.resident_lever = 0.9e9;
  f.kl_mean = 5e-6, f.kl_p99 = 5e-5;  // rounding-level differences are still parity
  EXPECT_EQ(decide(f).verdict, "promote");
}

TEST(Verdict, AFasterMedianWithinTheSpreadIsNoise) {
  LeverFigures f = same();
  f.decode_lever = 110, f.decode_lever_min = 95;  // its slowest run is below the baseline's median
  const Verdict v = decide(f);
  EXPECT_FALSE(v.faster);
  EXPECT_EQ(v.verdict, "refuse");
}

TEST(Verdict, SpeedIsNotJudgedOverTooFewRuns) {
  LeverFigures f = same();
  f.decode_lever = f.decode_lever_min = f.decode_lever_max = 190;  // one run: min = max = median
  f.speed_runs = 1;
  Verdict v = decide(f);
  EXPECT_EQ(v.verdict, "refuse");
  EXPECT_FALSE(v.faster);
  EXPECT_NE(v.reason.find("speed not judged over 1 run(s) (needs 3)"), std::string::npos) << v.reason;
  f.resident_lever = 0.5e9;  // memory is judged whatever the runs
  f.decode_lever = f.decode_lever_min = f.decode_lever_max = 50;
  v = decide(f);
  EXPECT_EQ(v.verdict, "promote") << v.reason;
  EXPECT_FALSE(v.slower);
}

TEST(Verdict, SmallerButSlowerIsExplicit) {
  LeverFigures f = same();
  f.resident_lever = 0.5e9;
  f.decode_lever = 80, f.decode_lever_min = 78, f.decode_lever_max = 82;
  const Verdict v = decide(f);
  EXPECT_EQ(v.verdict, "explicit");
  EXPECT_TRUE(v.slower && v.smaller);
  EXPECT_NE(v.reason.find("trades decode -20.0%"), std::string::npos) << v.reason;
  // A slower median whose fastest run reaches the baseline is not a measured cost.
  f.decode_lever_max = 101;
  EXPECT_EQ(decide(f).verdict, "promote");
}

TEST(Verdict, BoundedLossForAGainIsExplicit) {
  LeverFigures f = same();
  f.greedy_match_rate = 0.6, f.kl_mean = 0.02, f.kl_p99 = 0.1, f.ppl_lever = 20.5;  // +2.5%
  f.resident_lever = 0.3e9;
  const Verdict v = decide(f);
  EXPECT_EQ(v.quality, "bounded loss");
  EXPECT_EQ(v.verdict, "explicit");
  EXPECT_NE(v.reason.find("quality"), std::string::npos) << v.reason;
  // The same loss with nothing gained is refused.
  f.resident_lever = f.resident_baseline;
  EXPECT_EQ(decide(f).verdict, "refuse");
}

TEST(Verdict, AnyGreedyDivergenceIsNotParity) {
  LeverFigures f = same();
  f.greedy_match_rate = 0.99;
  f.resident_lever = 0.5e9;
  EXPECT_EQ(decide(f).quality, "bounded loss");
  EXPECT_EQ(decide(f).verdict, "explicit");
}

TEST(Verdict, LossBeyondTheBoundsIsRefusedWhateverTheGain) {
  for (int which = 0; which < 3; ++which) {
    LeverFigures f = same();
    f.greedy_match_rate = 0.9, f.kl_mean = 0.01;
    if (which == 0) f.kl_mean = 0.06;
    if (which == 1) f.ppl_lever = 21.2;  // +6%
    if (which == 2) f.greedy_match_rate = 0.2;
    f.decode_lever = f.decode_lever_min = f.decode_lever_max = 300;
    f.resident_lever = 0.25e9;
    const Verdict v = decide(f);
    EXPECT_EQ(v.verdict, "refuse") << which;
    EXPECT_EQ(v.quality, "loss beyond bounds") << which;
    EXPECT_NE(v.reason.find("beyond the bounds"), std::string::npos) << v.reason;
  }
}

TEST(Verdict, NotEngagedAndNotApplicable) {
  Verdict v = decide(same(), std::string("kv cache mode affine8: refused on cuda"));
  EXPECT_EQ(v.verdict, "refuse");
  EXPECT_EQ(v.reason, "cannot engage: kv cache mode affine8: refused on cuda");
  v = decide(same(), std::string("a CUDA lever"), /*not_applicable=*/true);
  EXPECT_EQ(v.verdict, "not_applicable");
  EXPECT_EQ(v.reason, "a CUDA lever");
}

}  // namespace
}  // namespace mere
