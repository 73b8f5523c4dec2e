#include "engine/generate.h"

#include <algorithm>
#include <chrono>

#include "engine/decode_graph.h"

namespace mere {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

GenerateStats generate(const Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                       const TokenSink& on_token) {
  MERE_CHECK(!prompt.empty(), "generate: the prompt has no tokens");
  const int64_t vocab = model.info().vocab;
  MERE_CHECK(int64_t(prompt.size()) < model.info().max_positions,
             "the prompt has {} tokens; the model's context holds {}", prompt.size(), model.info().max_positions);
  // Room for the prompt and the budget, within the model's context.
  std::unique_ptr<SeqState> state = model.make_state(
      std::min<int64_t>(model.info().max_positions, int64_t(prompt.size()) + options.max_new_tokens + 1));
  std::unique_ptr<DecodeGraph> graph;
  if (model.info().device == Device::cuda && options.levers.cuda_graphs)
    graph = std::make_unique<DecodeGraph>(model, *state);
  Sampler sampler(options.sampling);
  std::vector<int32_t> context = prompt;
  GenerateStats stats;
  stats.prompt_tokens = int64_t(prompt.size());

  auto t0 = std::chrono::steady_clock::now();
  // The copy to the host (the sampler runs there for now) waits for the GPU, so
  // the prefill time includes all of its work.
  Tensor logits = model.forward(prompt, *state, /*all_logits=*/false).to_device(Device::cpu);
  stats.prefill_ms = ms_since(t0);
  auto decode_start = std::chrono::steady_clock::now();
  stats.stop_reason = "length";
  for (int i = 0; i < options.max_new_tokens; ++i) {
    int32_t id = sampler.sample(logits.data<float>(), vocab, context);
    if (i == 0) stats.ttft_ms = ms_since(t0);
    context.push_back(id);
    ++stats.generated_tokens;
    if (std::find(options.eos_ids.begin(), options.eos_ids.end(), id) != options.eos_ids.end()) {
      stats.stop_reason = "eos";
      break;
    }
    if (!on_token(id)) {
      stats.stop_reason = "stop";
      break;
    }
    if (i + 1 == options.max_new_tokens) break;  // the last token needs no forward
    if (state->length() >= state->capacity()) {
      stats.stop_reason = "context";
      break;
    }
    if (i == 0) decode_start = std::chrono::steady_clock::now();
    if (graph) {
      logits = graph->step(id).to_device(Device::cpu);
    } else {
      logits = model.forward({id}, *state, false).to_device(Device::cpu);
      ++stats.eager_decode_steps;
    }
  }
  if (graph) {
    stats.graph_captures = graph->captures();
    stats.graph_replays = graph->replays();
  }
  stats.decode_ms = stats.generated_tokens > 1 ? ms_since(decode_start) : 0;
  return stats;
}

}  // namespace mere
