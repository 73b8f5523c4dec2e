// The A/B gate behind `mere audit`: the baseline (the checkpoint as stored, default
// settings) and each lever run on the same checkpoint revision, prompts, seed and
// token budget, in one process, timed runs alternating between them. Per lever:
// greedy token parity, teacher-forced perplexity and KL against the baseline,
// sampled-output agreement at the same seed, resident memory, prefill/decode
// tok/s and time to first token, and the verdict of the written policy
// (audit/verdict.h, docs/levers.md).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "audit/inputs.h"
#include "audit/metrics.h"
#include "audit/verdict.h"
#include "core/device.h"

namespace mere {

struct AuditOptions {
  std::filesystem::path model_dir;
  std::string model_label;              // what the user named (-m), for the report
  std::vector<std::string> levers;      // --lever texts
  bool combine = false;                 // also all levers together
  std::filesystem::path prompts_file, corpus_file;
  std::filesystem::path out_dir;        // reports, and scratch/ for quantized copies
  int max_new_tokens = 128;
  uint64_t seed = 0;
  int runs = 3;                         // timed runs per arm, after one warm-up
  float temperature = 0.8f;             // the sampled comparison
  int64_t corpus_tokens = 2048;         // corpus tokens scored (from its start)
  int64_t window = 256;                 // teacher-forced window (capped at the model's context)
  // Teacher-forced tokens scored one decode step at a time (the path decode-only
  // levers such as int8_activation_matvec change) instead of one prefill per window.
  bool decode_steps = false;
  Device device = Device::cpu;
};

// One measured configuration: the baseline or a lever.
struct ArmResult {
  std::string label;        // "baseline", "kv=affine8", ...
  std::string model_dir;    // the checkpoint it loaded (a quantized copy for weights levers)
  std::string weights;      // its weight format, as the model reports it
  std::string kv_mode;
  std::string levers;       // the engine levers in effect
  std::optional<std::string> not_engaged;  // why it did not run (then only this is set)
  bool not_applicable = false;

  // Tokens per prompt: greedy and sampled.
  std::vector<std::vector<int32_t>> greedy, sampled;
  // Memory.
  uint64_t weight_bytes = 0;
  uint64_t cache_capacity_bytes = 0;  // the cache at the model's full context, in this mode
  int64_t cache_capacity_tokens = 0;
  uint64_t cache_measured_bytes = 0;  // a SeqState reserved at the audit's largest prompt + budget
  int64_t cache_measured_tokens = 0;
  // CPU: the most tensor bytes alive at once during a greedy generation of the longest
  // prompt, beyond what was alive before it and its cache (activations, logits, the f32
  // copy attention reads from a bf16 or quantized cache). Not measured on CUDA.
  std::optional<uint64_t> workspace_bytes;
  // Speed over the timed runs (each run: every prompt once).
  std::vector<double> prefill_tok_s, decode_tok_s, ttft_ms;
  Spread prefill, decode, ttft;
  // Teacher-forced perplexity over the corpus slice.
  double ppl = 0;
};

// A lever against the baseline.
struct LeverComparison {
  std::string lever;
  std::vector<TokenParity> greedy, sampled;
  double greedy_match_rate = 1, sampled_match_rate = 1;
  struct Excerpt {
    std::string prompt, baseline, lever;  // decoded text from a little before the first divergence
    int64_t first_divergence = 0;
  };
  std::vector<Excerpt> excerpts;
  KlStats kl;
  Verdict verdict;
};

struct AuditReport {
  std::string date;  // UTC, ISO 8601
  std::string model_label, model_dir, model_type, revision;
  std::string device, speed_label;  // "CPU" figures are labelled as such
  AuditOptions options;
  std::vector<AuditPrompt> prompts;
  std::vector<int64_t> prompt_tokens;
  int64_t corpus_tokens_scored = 0, windows = 0;
  ArmResult baseline;
  std::vector<ArmResult> arms;  // one per lever (and the combination), same order as comparisons
  std::vector<LeverComparison> comparisons;
  uint64_t peak_rss_bytes = 0;  // the whole process, all arms together
  std::vector<std::string> notes;
};

// Runs the audit, with progress on stderr. Errors in the inputs are thrown before
// any model runs; a lever that cannot engage is reported (refuse) and the others go on.
AuditReport run_audit(const AuditOptions& options);

}  // namespace mere
