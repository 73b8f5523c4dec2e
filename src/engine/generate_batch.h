// Same-offset batched generation: B sequences, each prefilled alone, then
// decoded together, one forward over B rows per step (Model::run with B
// states). On the GPU a step is DecodeStep over the batch: sampling on the
// device for all B rows, one CUDA graph replay per step (lever cuda_graphs), the
// next step queued before the host reads the B tokens (lever pipelined_decode).
// On the CPU it is the plain loop (forward_batch, the host sampler per row).
//
// Each sequence gets the tokens it would get from generate_from alone (greedy,
// and seeded sampling with the same seed) as long as the model's arithmetic for
// a row does not depend on B (tested, not assumed). A sequence that stops (EOS,
// its sink, the budget) keeps its row in the batch until all have stopped, so
// the graph's batch never changes; its extra positions are dropped at the end.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/generate.h"

namespace mere {

struct BatchGenerateStats {
  int64_t batch = 0;
  int64_t generated_tokens = 0;     // over all sequences (each one's EOS or stop token included, as generate counts)
  int64_t steps_read = 0;           // batched samplings the host read (the prefill's included)
  double prefill_ms = 0;            // every sequence's prefill and the first batched sampling
  double decode_ms = 0;             // from the second batched read to the last
  std::vector<std::string> stop_reasons;  // per sequence: "eos", "length", "stop", "context"
  // What ran, counted by the engine (tests assert on these).
  int64_t eager_decode_steps = 0, graph_captures = 0, graph_replays = 0;
  int64_t token_copies = 0;  // device-to-host copies of sampled tokens (the first only, with kernel_token_slots)
  int64_t pipelined_steps = 0;        // steps queued before the previous tokens were read
  int64_t rolled_back_positions = 0;  // steps queued past the last stop, undone (per sequence)
  bool device_sampled = false;        // tokens picked on the GPU

  // Batch rows per second over the reads after the second (decode_ms's span): the
  // rows of sequences that already stopped count too, since the step computed them.
  double decode_tok_s() const { return decode_ms > 0 ? double(batch * (steps_read - 2)) * 1e3 / decode_ms : 0; }
};

// Receives token `id` of sequence `seq`; returning false stops that sequence ("stop").
using BatchTokenSink = std::function<bool(int64_t seq, int32_t id)>;

// Prefills prompts[b] after the cached tokens of states[b] and decodes the batch.
// Every state must hold the same number of tokens once its prompt has run. Each
// state ends as generate_from would leave it: its prompt and the tokens it
// forwarded. options.prefix_cache is not used.
BatchGenerateStats generate_batch(const Model& model, std::span<SeqState* const> states,
                                  const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& options,
                                  const BatchTokenSink& on_token);

}  // namespace mere
