// The CPU generation loop: prefill the prompt, then sample and decode one token
// at a time until EOS, a stop, the token budget or the context limit.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/levers.h"
#include "models/model.h"
#include "sampling/sampler.h"

namespace mere {

struct GenerateOptions {
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> eos_ids;
  Levers levers = Levers::from_env();
};

struct GenerateStats {
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double prefill_ms = 0, decode_ms = 0, ttft_ms = 0;
  std::string stop_reason;  // "eos", "length", "stop", "context"
  // What actually ran, counted by the engine (tests assert on these).
  int64_t eager_decode_steps = 0, graph_captures = 0, graph_replays = 0;

  double prefill_tok_s() const { return prefill_ms > 0 ? prompt_tokens * 1e3 / prefill_ms : 0; }
  // Decode rate over the tokens after the first (the first comes from prefill).
  double decode_tok_s() const { return decode_ms > 0 ? (generated_tokens - 1) * 1e3 / decode_ms : 0; }
};

// Receives each sampled token; returning false stops generation ("stop").
using TokenSink = std::function<bool(int32_t)>;

GenerateStats generate(const Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                       const TokenSink& on_token);

}  // namespace mere
