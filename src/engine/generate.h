// The generation loop: prefill the prompt, then sample and decode one token at a
// time until EOS, a stop, the token budget or the context limit.
// On the GPU the loop never copies logits to the host: sampling runs on the
// device, each step is one CUDA graph replay (lever cuda_graphs), and the next
// step is queued before the host has read the previous token (lever
// pipelined_decode). On the CPU it is the plain reference loop.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/levers.h"
#include "models/model.h"
#include "sampling/sampler.h"
#include "state/prefix_cache.h"

namespace mere {

struct GenerateOptions {
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> eos_ids;
  Levers levers = Levers::from_env();
  KvCacheMode kv_cache_mode = KvCacheMode::native;  // how generate() stores K/V
  // When set, generate() starts from the longest prefix of the prompt this cache
  // holds and afterwards publishes the blocks of the prompt and the generated
  // tokens to it. Its pool must have
  // the model's K/V layout in kv_cache_mode (paged states: the CPU for now).
  PrefixCache* prefix_cache = nullptr;
};

struct GenerateStats {
  int64_t prompt_tokens = 0, generated_tokens = 0;  // prompt_tokens: those the prefill ran
  int64_t reused_prefix_tokens = 0;                  // prompt positions taken from the prefix cache
  double prefill_ms = 0, ttft_ms = 0;
  double decode_ms = 0;  // from the second token's arrival to the last's (the first step may capture a graph)
  std::string stop_reason;  // "eos", "length", "stop", "context"
  // What actually ran, counted by the engine (tests assert on these).
  int64_t eager_decode_steps = 0, graph_captures = 0, graph_replays = 0;
  int64_t token_copies = 0;  // device-to-host copies of sampled tokens (the first only, with kernel_token_slots)
  int64_t device_sampled_tokens = 0;  // tokens picked on the GPU (no logits copied to the host)
  int64_t pipelined_steps = 0;        // steps queued before the previous token was read
  int64_t rolled_back_positions = 0;  // steps queued past a stop, undone

  double prefill_tok_s() const { return prefill_ms > 0 ? prompt_tokens * 1e3 / prefill_ms : 0; }
  // Decode rate over the tokens after the second (decode_ms's span).
  double decode_tok_s() const { return decode_ms > 0 ? (generated_tokens - 2) * 1e3 / decode_ms : 0; }
};

// Receives each sampled token; returning false stops generation ("stop").
using TokenSink = std::function<bool(int32_t)>;

GenerateStats generate(const Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                       const TokenSink& on_token);

// The same, continuing `state` (which may already hold a context): the prompt
// goes after its cached tokens. Penalties see only `prompt` and what is generated.
// Runs `prompt` after the state's cached tokens (in chunks) and returns the last token's logits [1, vocab].
Tensor prefill(const Model& model, SeqState& state, const std::vector<int32_t>& prompt);

GenerateStats generate_from(const Model& model, SeqState& state, const std::vector<int32_t>& prompt,
                            const GenerateOptions& options, const TokenSink& on_token);

}  // namespace mere
