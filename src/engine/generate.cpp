#include "engine/generate.h"

#include <algorithm>
#include <chrono>

#include "engine/decode_step.h"
#include "sampling/device_sampler.h"

namespace mere {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

bool is_eos(const GenerateOptions& options, int32_t id) {
  return std::find(options.eos_ids.begin(), options.eos_ids.end(), id) != options.eos_ids.end();
}

// The reference loop (CPU): logits on the host, the host sampler. `prompt` runs;
// penalties see `seen` (the prompt with any reused prefix).
void decode_on_host(const Model& model, SeqState& state, const std::vector<int32_t>& prompt,
                    const std::vector<int32_t>& seen, const GenerateOptions& options, const TokenSink& on_token,
                    GenerateStats& stats) {
  Sampler sampler(options.sampling);
  std::vector<int32_t> context = seen;
  auto t0 = Clock::now();
  Tensor logits = prefill(model, state, prompt).to_device(Device::cpu);
  stats.prefill_ms = ms_since(t0);
  auto decode_start = Clock::now();
  for (int i = 0; i < options.max_new_tokens; ++i) {
    int32_t id = sampler.sample(logits.data<float>(), model.info().vocab, context);
    if (i == 0) stats.ttft_ms = ms_since(t0);
    if (i == 1) decode_start = Clock::now();
    context.push_back(id);
    ++stats.generated_tokens;
    if (is_eos(options, id)) stats.stop_reason = "eos";
    else if (!on_token(id)) stats.stop_reason = "stop";
    else if (i + 1 == options.max_new_tokens) break;  // the last token needs no forward
    else if (state.length() >= state.capacity()) stats.stop_reason = "context";
    if (!stats.stop_reason.empty()) break;  // every way out times the decode
    logits = model.forward({id}, state, false).to_device(Device::cpu);
    ++stats.eager_decode_steps;
  }
  if (stats.generated_tokens > 2) stats.decode_ms = ms_since(decode_start);
}

// The GPU loop: sampling on the device, each step one graph replay, and (lever
// pipelined_decode) step k + 1 queued before token k is read. Token k decides
// whether step k + 1 was needed; if not (EOS or a stop), its position is rolled back.
void decode_on_device(const Model& model, SeqState& state, const std::vector<int32_t>& prompt,
                      const std::vector<int32_t>& seen, const GenerateOptions& options, const TokenSink& on_token,
                      GenerateStats& stats) {
  DeviceSampler sampler(options.sampling, model.info().vocab);
  sampler.reset(seen);
  DecodeStep step(model, state, sampler, options.levers.cuda_graphs, options.levers.kernel_token_slots);
  const bool pipelined = options.levers.pipelined_decode;
  const int budget = options.max_new_tokens;

  auto t0 = Clock::now();
  Tensor logits = prefill(model, state, prompt);
  // The first token is read before the pipeline opens: an immediate EOS costs no forward.
  int32_t id = step.wait(step.begin(logits));
  stats.prefill_ms = stats.ttft_ms = ms_since(t0);
  auto decode_start = Clock::now();
  int ahead = -1;  // the ticket of a step queued before `id` was read (it forwards `id`)
  for (int i = 0;; ++i) {  // `id` is token i, read
    ++stats.generated_tokens;
    if (i == 1) decode_start = Clock::now();
    if (is_eos(options, id)) stats.stop_reason = "eos";
    else if (!on_token(id)) stats.stop_reason = "stop";
    else if (i + 1 == budget) stats.stop_reason = "length";
    else if (ahead < 0 && state.length() >= state.capacity()) stats.stop_reason = "context";
    if (!stats.stop_reason.empty()) {
      if (ahead >= 0) {  // forwarded a token that ends the output: undo its position
        step.roll_back(1);
        ++stats.rolled_back_positions;
      }
      break;
    }
    const int current = ahead >= 0 ? ahead : step.queue();  // forwards token i, samples token i + 1
    ahead = -1;
    // Queue the step after it now, unless token i + 1 is the budget's last (its
    // forward would be thrown away) or the context is full.
    if (pipelined && i + 2 < budget && state.length() < state.capacity()) {
      ahead = step.queue();
      ++stats.pipelined_steps;
    }
    id = step.wait(current);
  }
  if (stats.generated_tokens > 2) stats.decode_ms = ms_since(decode_start);
  stats.device_sampled_tokens = stats.generated_tokens + stats.rolled_back_positions;
  stats.graph_captures = step.captures();
  stats.graph_replays = step.replays();
  stats.token_copies = step.token_copies();
  stats.eager_decode_steps = step.eager_steps();
}

GenerateStats run_generation(const Model& model, SeqState& state, const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& seen, const GenerateOptions& options,
                             const TokenSink& on_token) {
  MERE_CHECK(!prompt.empty(), "generate: the prompt has no tokens");
  MERE_CHECK(options.max_new_tokens >= 1, "generate: max_new_tokens must be at least 1, got {}",
             options.max_new_tokens);
  MERE_CHECK(state.length() + int64_t(prompt.size()) < state.capacity(),
             "the prompt has {} tokens after {} cached; the context holds {}", prompt.size(), state.length(),
             state.capacity());
  GenerateStats stats;
  stats.prompt_tokens = int64_t(prompt.size());
  if (model.info().device == Device::cuda)
    decode_on_device(model, state, prompt, seen, options, on_token, stats);
  else
    decode_on_host(model, state, prompt, seen, options, on_token, stats);
  if (stats.stop_reason.empty()) stats.stop_reason = "length";
  return stats;
}

bool same_layout(const KvLayout& a, const KvLayout& b) {
  return a.n_layers == b.n_layers && a.n_kv_heads == b.n_kv_heads && a.head_dim == b.head_dim && a.mode == b.mode &&
         a.device == b.device;
}

}  // namespace

Tensor prefill(const Model& model, SeqState& state, const std::vector<int32_t>& prompt) {
  constexpr size_t kPrefillChunk = 2048;  // long prompts run in chunks, so one forward's activations stay bounded
  Tensor logits;
  for (size_t done = 0; done < prompt.size();) {
    const size_t n = std::min<size_t>(kPrefillChunk, prompt.size() - done);
    logits = model.forward(std::vector<int32_t>(prompt.begin() + long(done), prompt.begin() + long(done + n)), state,
                           /*all_logits=*/false);
    done += n;
  }
  return logits;
}

GenerateStats generate_from(const Model& model, SeqState& state, const std::vector<int32_t>& prompt,
                            const GenerateOptions& options, const TokenSink& on_token) {
  return run_generation(model, state, prompt, prompt, options, on_token);
}

GenerateStats generate(const Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                       const TokenSink& on_token) {
  MERE_CHECK(int64_t(prompt.size()) < model.info().max_positions,
             "the prompt has {} tokens; the model's context holds {}", prompt.size(), model.info().max_positions);
  // Room for the prompt and the budget, within the model's context.
  const int64_t capacity =
      std::min<int64_t>(model.info().max_positions, int64_t(prompt.size()) + options.max_new_tokens + 1);
  if (!options.prefix_cache) {
    std::unique_ptr<SeqState> state = model.make_state(capacity, options.kv_cache_mode);
    return generate_from(model, *state, prompt, options, on_token);
  }
  PrefixCache& cache = *options.prefix_cache;
  MERE_CHECK(same_layout(cache.pool()->layout(), model.kv_layout(options.kv_cache_mode)),
             "generate: the prefix cache's pool does not hold this model's K/V in kv cache mode {}",
             kv_cache_mode_name(options.kv_cache_mode));
  // A pool can hold less than the model's context (on CUDA a chat's pool is
  // allocated whole, within the GPU's memory): the sequence stops where the pool
  // ends, as it would at the end of the context, instead of failing mid-answer.
  const int64_t pool_tokens = cache.pool()->capacity_tokens();
  MERE_CHECK(int64_t(prompt.size()) < pool_tokens, "the prompt has {} tokens; the K/V pool holds {}", prompt.size(),
             pool_tokens);
  std::unique_ptr<SeqState> state = cache.start(prompt, std::min(capacity, pool_tokens));
  const int64_t reused = state->length();
  const std::vector<int32_t> rest(prompt.begin() + long(reused), prompt.end());
  std::vector<int32_t> tokens = prompt;  // what the state's positions hold: the prompt, then what was forwarded
  GenerateStats stats = run_generation(model, *state, rest, prompt, options, [&](int32_t id) {
    tokens.push_back(id);
    return on_token(id);
  });
  stats.reused_prefix_tokens = reused;
  tokens.resize(std::min(tokens.size(), size_t(state->length())));  // the last token sampled was not forwarded
  cache.publish(*state, tokens);
  return stats;
}

}  // namespace mere
