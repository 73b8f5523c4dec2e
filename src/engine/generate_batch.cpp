#include "engine/generate_batch.h"

#include <algorithm>
#include <chrono>

#include "engine/decode_step.h"
#include "ops/ops.h"
#include "sampling/device_sampler.h"

namespace mere {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Which sequences still take tokens: the same stop rules as generate's loops, per sequence.
class Outcomes {
 public:
  Outcomes(const GenerateOptions& options, const BatchTokenSink& sink, BatchGenerateStats& stats)
      : options_(options), sink_(sink), stats_(stats), read_(size_t(stats.batch), 0) {
    stats_.stop_reasons.assign(size_t(stats.batch), "");
  }

  // The i-th batched read (token i of every sequence); returns whether any sequence is still open.
  bool take(int i, std::span<const int32_t> ids) {
    bool open = false;
    for (size_t b = 0; b < ids.size(); ++b) {
      std::string& reason = stats_.stop_reasons[b];
      if (!reason.empty()) continue;
      ++read_[b];
      ++stats_.generated_tokens;
      const int32_t id = ids[b];
      if (std::find(options_.eos_ids.begin(), options_.eos_ids.end(), id) != options_.eos_ids.end()) reason = "eos";
      else if (!sink_(int64_t(b), id)) reason = "stop";
      else if (i + 1 == options_.max_new_tokens) reason = "length";
      else open = true;
    }
    return open;
  }
  void stop_open(const char* reason) {
    for (std::string& r : stats_.stop_reasons)
      if (r.empty()) r = reason;
  }
  // The positions sequence b holds once its last read token is dropped (it was never forwarded alone).
  int64_t forwarded(size_t b) const { return read_[b] - 1; }

 private:
  const GenerateOptions& options_;
  const BatchTokenSink& sink_;
  BatchGenerateStats& stats_;
  std::vector<int64_t> read_;
};

int64_t smallest_capacity(std::span<SeqState* const> states) {
  int64_t c = states.front()->capacity();
  for (SeqState* s : states) c = std::min(c, s->capacity());
  return c;
}

// The reference loop (CPU): logits on the host, a host sampler per row.
void decode_on_host(const Model& model, std::span<SeqState* const> states,
                    const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& options,
                    Outcomes& outcomes, BatchGenerateStats& stats) {
  const size_t B = states.size();
  const int64_t vocab = model.info().vocab;
  const std::vector<SeqState*> batch(states.begin(), states.end());
  std::vector<Sampler> samplers(B, Sampler(options.sampling));
  std::vector<std::vector<int32_t>> contexts = prompts;  // what the penalties see
  std::vector<int32_t> ids(B);
  auto sample_row = [&](size_t b, const float* logits) {
    ids[b] = samplers[b].sample(logits, vocab, contexts[b]);
    contexts[b].push_back(ids[b]);
  };
  auto t0 = Clock::now();
  for (size_t b = 0; b < B; ++b) sample_row(b, prefill(model, *states[b], prompts[b]).to_device(Device::cpu).data<float>());
  stats.prefill_ms = ms_since(t0);
  const int64_t capacity = smallest_capacity(states);
  auto decode_start = Clock::now();
  for (int i = 0;; ++i) {
    stats.steps_read = i + 1;
    if (i == 1) decode_start = Clock::now();
    if (!outcomes.take(i, ids)) break;
    if (batch.front()->length() >= capacity) {
      outcomes.stop_open("context");
      break;
    }
    const Tensor logits = model.forward_batch(ids, batch).to_device(Device::cpu);  // [B, vocab]
    ++stats.eager_decode_steps;
    for (size_t b = 0; b < B; ++b) sample_row(b, logits.data<float>() + int64_t(b) * vocab);
  }
  if (stats.steps_read > 2) stats.decode_ms = ms_since(decode_start);
}

// The GPU loop: generate's decode_on_device over B rows. Reads i's tokens
// decide whether the step queued ahead (forwarding them) was needed; if every
// sequence has stopped, its position is rolled back.
void decode_on_device(const Model& model, std::span<SeqState* const> states,
                      const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& options,
                      Outcomes& outcomes, BatchGenerateStats& stats) {
  const int64_t B = int64_t(states.size());
  DeviceSampler sampler(options.sampling, model.info().vocab, B);
  sampler.reset(prompts);
  DecodeStep step(model, states, sampler, options.levers.cuda_graphs, options.levers.kernel_token_slots);
  const bool pipelined = options.levers.pipelined_decode;
  const int budget = options.max_new_tokens;

  auto t0 = Clock::now();
  Tensor first = Tensor::empty({B, model.info().vocab}, DType::f32, Device::cuda);  // each prefill's last logits
  for (int64_t b = 0; b < B; ++b) {
    Tensor row = first.slice_rows(b, b + 1);
    ops::convert_into(prefill(model, *states[size_t(b)], prompts[size_t(b)]), row);
  }
  std::span<const int32_t> ids = step.wait_all(step.begin(first));
  stats.prefill_ms = ms_since(t0);
  auto decode_start = Clock::now();
  int ahead = -1;  // the ticket of a step queued before `ids` were read (it forwards them)
  for (int i = 0;; ++i) {  // `ids` are token i of each sequence, read
    stats.steps_read = i + 1;
    if (i == 1) decode_start = Clock::now();
    bool open = outcomes.take(i, ids);
    if (open && ahead < 0 && step.length() >= step.capacity()) {
      outcomes.stop_open("context");
      open = false;
    }
    if (!open) {
      if (ahead >= 0) {
        step.roll_back(1);
        ++stats.rolled_back_positions;
      }
      break;
    }
    const int current = ahead >= 0 ? ahead : step.queue();  // forwards tokens i, samples tokens i + 1
    ahead = -1;
    if (pipelined && i + 2 < budget && step.length() < step.capacity()) {
      ahead = step.queue();
      ++stats.pipelined_steps;
    }
    ids = step.wait_all(current);
  }
  if (stats.steps_read > 2) stats.decode_ms = ms_since(decode_start);
  stats.device_sampled = true;
  stats.graph_captures = step.captures();
  stats.graph_replays = step.replays();
  stats.token_copies = step.token_copies();
  stats.eager_decode_steps = step.eager_steps();
}

}  // namespace

BatchGenerateStats generate_batch(const Model& model, std::span<SeqState* const> states,
                                  const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& options,
                                  const BatchTokenSink& on_token) {
  MERE_CHECK(!states.empty() && prompts.size() == states.size(), "generate_batch: {} prompts for {} sequences",
             prompts.size(), states.size());
  MERE_CHECK(options.max_new_tokens >= 1, "generate_batch: max_new_tokens must be at least 1, got {}",
             options.max_new_tokens);
  const int64_t offset = states.front()->length() + int64_t(prompts.front().size());
  for (size_t b = 0; b < states.size(); ++b) {
    MERE_CHECK(!prompts[b].empty(), "generate_batch: prompt {} has no tokens", b);
    MERE_CHECK(states[b]->length() + int64_t(prompts[b].size()) == offset,
               "generate_batch: sequence {} reaches {} tokens after its prompt, sequence 0 {}; a batch shares one "
               "offset",
               b, states[b]->length() + int64_t(prompts[b].size()), offset);
    MERE_CHECK(offset < states[b]->capacity(), "the prompt of sequence {} ends at {} tokens; its context holds {}", b,
               offset, states[b]->capacity());
  }
  BatchGenerateStats stats;
  stats.batch = int64_t(states.size());
  Outcomes outcomes(options, on_token, stats);
  if (model.info().device == Device::cuda)
    decode_on_device(model, states, prompts, options, outcomes, stats);
  else
    decode_on_host(model, states, prompts, options, outcomes, stats);
  // Positions forwarded after a sequence stopped belong to no output.
  for (size_t b = 0; b < states.size(); ++b)
    if (states[b]->length() > offset + outcomes.forwarded(b)) states[b]->truncate(offset + outcomes.forwarded(b));
  return stats;
}

}  // namespace mere
