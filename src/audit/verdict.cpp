#include "audit/verdict.h"

#include <cmath>
#include <vector>

#include <fmt/format.h>

namespace mere {
namespace {

double rel(double lever, double baseline) { return baseline > 0 ? lever / baseline - 1 : 0; }

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

}  // namespace

Verdict decide(const LeverFigures& f, const std::optional<std::string>& not_engaged, bool not_applicable) {
  Verdict v;
  if (not_applicable) {
    v.verdict = "not_applicable";
    v.reason = not_engaged.value_or("the lever does not apply here");
    return v;
  }
  if (not_engaged) {
    v.verdict = "refuse";
    v.reason = "cannot engage: " + *not_engaged;
    return v;
  }
  const double ppl_rel = rel(f.ppl_lever, f.ppl_baseline);
  const std::string quality_figures =
      fmt::format("greedy match {:.1f}%, KL mean {:.2g} / p99 {:.2g} nats, ppl {:+.2f}%", 100 * f.greedy_match_rate,
                  f.kl_mean, f.kl_p99, 100 * ppl_rel);
  if (f.greedy_match_rate >= 1 && f.kl_mean <= kParityKlMean && f.kl_p99 <= kParityKlP99 &&
      std::abs(ppl_rel) <= kParityPplRel) {
    v.quality = "parity";
  } else if (f.kl_mean <= kBoundKlMean && ppl_rel <= kBoundPplRel && f.greedy_match_rate >= kBoundMatchRate) {
    v.quality = "bounded loss";
  } else {
    v.quality = "loss beyond bounds";
    std::vector<std::string> over;
    if (f.kl_mean > kBoundKlMean) over.push_back(fmt::format("KL mean {:.3g} > {:g}", f.kl_mean, kBoundKlMean));
    if (ppl_rel > kBoundPplRel) over.push_back(fmt::format("ppl {:+.2f}% > +{:g}%", 100 * ppl_rel, 100 * kBoundPplRel));
    if (f.greedy_match_rate < kBoundMatchRate)
      over.push_back(fmt::format("greedy match {:.1f}% < {:g}%", 100 * f.greedy_match_rate, 100 * kBoundMatchRate));
    v.verdict = "refuse";
    v.reason = "quality loss beyond the bounds: " + join(over, ", ");
    return v;
  }

  const double decode = rel(f.decode_lever, f.decode_baseline), prefill = rel(f.prefill_lever, f.prefill_baseline);
  // Too few runs to tell a speed difference from noise: speed is reported, not judged.
  const bool judge_speed = f.speed_runs >= kMinSpeedRuns;
  // Faster: the median clears the margin and even the lever's slowest run beats the
  // baseline's median. Slower, the mirror: even its fastest run is below that median.
  const bool decode_faster =
      judge_speed && f.decode_baseline > 0 && decode >= kSpeedMargin && f.decode_lever_min > f.decode_baseline;
  const bool prefill_faster =
      judge_speed && f.prefill_baseline > 0 && prefill >= kSpeedMargin && f.prefill_lever_min > f.prefill_baseline;
  const bool decode_slower =
      judge_speed && f.decode_baseline > 0 && decode <= -kSpeedMargin && f.decode_lever_max < f.decode_baseline;
  const bool prefill_slower =
      judge_speed && f.prefill_baseline > 0 && prefill <= -kSpeedMargin && f.prefill_lever_max < f.prefill_baseline;
  v.faster = decode_faster || prefill_faster;
  v.slower = decode_slower || prefill_slower;
  const double memory = rel(f.resident_lever, f.resident_baseline);
  v.smaller = memory <= -kMemoryMargin;
  v.larger = memory >= kMemoryMargin;

  std::vector<std::string> gains, costs;
  if (decode_faster) gains.push_back(fmt::format("decode {:+.1f}%", 100 * decode));
  if (prefill_faster) gains.push_back(fmt::format("prefill {:+.1f}%", 100 * prefill));
  if (v.smaller) gains.push_back(fmt::format("resident memory {:+.1f}%", 100 * memory));
  if (decode_slower) costs.push_back(fmt::format("decode {:+.1f}%", 100 * decode));
  if (prefill_slower) costs.push_back(fmt::format("prefill {:+.1f}%", 100 * prefill));
  if (v.larger) costs.push_back(fmt::format("resident memory {:+.1f}%", 100 * memory));
  if (v.quality == "bounded loss") costs.insert(costs.begin(), "quality (" + quality_figures + ")");

  if (gains.empty()) {
    v.verdict = "refuse";
    v.reason = fmt::format("no measured gain: decode {:+.1f}%, prefill {:+.1f}%, resident memory {:+.1f}% (margins "
                           "{:g}% / {:g}%){}{}",
                           100 * decode, 100 * prefill, 100 * memory, 100 * kSpeedMargin, 100 * kMemoryMargin,
                           judge_speed ? "" : fmt::format("; speed not judged over {} run(s) (needs {})",
                                                          f.speed_runs, kMinSpeedRuns),
                           v.quality == "parity" ? "" : "; and it costs quality (" + quality_figures + ")");
    return v;
  }
  if (v.quality == "parity" && costs.empty()) {
    v.verdict = "promote";
    v.reason = "parity (" + quality_figures + ") and " + join(gains, ", ");
    return v;
  }
  v.verdict = "explicit";
  v.reason = "trades " + join(costs, ", ") + " for " + join(gains, ", ");
  return v;
}

}  // namespace mere
