// The promotion policy of docs/levers.md ("The gate's policy"), as code: from a
// lever's measured figures against the baseline, `promote`, `explicit` or
// `refuse`, with the reason in words. The thresholds are here and in the doc;
// change both together.
#pragma once

#include <optional>
#include <string>

namespace mere {

// Quality: parity means the lever's outputs are the baseline's, up to rounding.
inline constexpr double kParityKlMean = 1e-5;     // nats, mean over the corpus positions
inline constexpr double kParityKlP99 = 1e-4;
inline constexpr double kParityPplRel = 0.001;    // |ppl_lever / ppl_baseline - 1|
// Quality: a bounded loss, which a user may choose to trade.
inline constexpr double kBoundKlMean = 0.05;
inline constexpr double kBoundPplRel = 0.05;      // at most 5% higher perplexity
inline constexpr double kBoundMatchRate = 0.25;   // greedy tokens before divergence, over all prompts
// Gains: a difference smaller than this is noise, not a gain or a loss.
inline constexpr double kSpeedMargin = 0.03;      // 3% on the median
inline constexpr double kMemoryMargin = 0.03;     // 3% of resident bytes (weights + cache at capacity)
// Speed is judged (as a gain or a cost) only over at least this many timed runs per arm.
inline constexpr int kMinSpeedRuns = 3;

struct LeverFigures {
  double greedy_match_rate = 1;
  double kl_mean = 0, kl_p99 = 0, kl_max = 0;
  double ppl_baseline = 0, ppl_lever = 0;
  // tok/s: the baseline's median, the lever's median and its slowest and fastest runs; 0 when not measured.
  double decode_baseline = 0, decode_lever = 0, decode_lever_min = 0, decode_lever_max = 0;
  double prefill_baseline = 0, prefill_lever = 0, prefill_lever_min = 0, prefill_lever_max = 0;
  double resident_baseline = 0, resident_lever = 0;  // bytes
  int speed_runs = kMinSpeedRuns;                     // timed runs per arm
};

struct Verdict {
  std::string verdict;  // "promote", "explicit", "refuse" or "not_applicable"
  std::string reason;
  // The classification behind it, for the report.
  std::string quality;  // "parity", "bounded loss", "loss beyond bounds"
  bool faster = false, slower = false, smaller = false, larger = false;
};

// `not_engaged`: why the lever could not run here (a lever for another backend,
// a mode the device refuses); then nothing else is read.
Verdict decide(const LeverFigures& f, const std::optional<std::string>& not_engaged = std::nullopt,
               bool not_applicable = false);

}  // namespace mere
